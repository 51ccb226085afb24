"""Node and GPU placement for whole and fractional GPU requests.

* :mod:`~gpuplane.core.placement.gpu_cluster`: the vectorised state of a cluster of GPU nodes
  (free CPU, memory and milli-GPU per GPU), feasibility masks and GPU selection helpers;
* :mod:`~gpuplane.core.placement.fragmentation`: the target workload ("typical pods") and the
  expected GPU fragmentation of a node under it, as defined by FGD (USENIX ATC'23);
* :mod:`~gpuplane.core.placement.scoring`: node score policies behind one narrow protocol
  (Random, DotProd, GpuClustering, GpuPacking, BestFit, FGD, and gpuplane's own default) and
  the tie-break that turns scores into one node.

Everything here is pure: randomness comes in as a :class:`numpy.random.Generator`, and a cluster
changes only through :meth:`GpuCluster.place` / :meth:`GpuCluster.release`.
"""
