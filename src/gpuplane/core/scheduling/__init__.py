"""The scheduler's parts, one object per module, built and composed by
:class:`gpuplane.core.scheduler.Scheduler`.

Internal to the core: drivers use :mod:`gpuplane.core.session`. See :mod:`.state` for the layout.
"""
