"""The scheduler's phases, one module each, stacked by :class:`gpuplane.core.scheduler.Scheduler`.

Internal to the core: drivers use :mod:`gpuplane.core.session`. See :mod:`.state` for the layout.
"""
