"""gpuplane: a scheduling control plane for GPUs and other accelerators on Kubernetes."""

__version__ = "0.1.0"
