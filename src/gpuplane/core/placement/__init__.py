"""Node and GPU placement: the engine, its GPU policies, and all-or-nothing gang placement.

Gang placement (one :class:`~gpuplane.core.placement.gang_placement.PlacementState` per scheduling call,
a thin composition of parts with one owner each):

* :mod:`~gpuplane.core.placement.gang_placement`: ``PlacementState``: place a gang whole or not at all,
  hold what is running or planned, release, why not;
* :mod:`~gpuplane.core.placement.gangs`: a gang's pod sets as placement needs them, where its
  pods went, why it has no place;
* :mod:`~gpuplane.core.placement.node_holdings`: every node's device state, what each owner
  holds, the free-device indexes and the engine's GPU array (``GpuRows``), all changed in one
  place;
* :mod:`~gpuplane.core.placement.topology_domains`: the topology domains and their free GPU;
* :mod:`~gpuplane.core.placement.eligibility`: the nodes that may ever hold a pod set, and why
  none may;
* :mod:`~gpuplane.core.placement.node_scores`: the profile learned from the workload and the
  engine's scores of nodes by look;
* :mod:`~gpuplane.core.placement.node_order`: the order a pod's candidate nodes are tried in;
* :mod:`~gpuplane.core.placement.reserve`: reserving a pod's planned devices on one node at bind
  time, or a typed refusal.

The engine and its policies:

* :mod:`~gpuplane.core.placement.engine`: filter, score and reserve plugins chosen by a profile
  (:mod:`~gpuplane.core.placement.profiles`);
* :mod:`~gpuplane.core.placement.gpu_arrays`: the vectorised state of a cluster of GPU nodes
  (free CPU, memory and milli-GPU per GPU), feasibility masks and GPU selection helpers;
* :mod:`~gpuplane.core.placement.fragmentation`: the target workload ("typical pods") and the
  expected GPU fragmentation of a node under it, as defined by FGD (USENIX ATC'23);
* :mod:`~gpuplane.core.placement.scoring`: node score policies behind one narrow protocol
  (Random, DotProd, GpuClustering, GpuPacking, BestFit, FGD, and gpuplane's own default) and
  the tie-break that turns scores into one node.

Everything here is pure: randomness comes in as a :class:`numpy.random.Generator`, and a
:class:`GpuArrays` changes only through its ``place``, ``release`` and ``set_free``.
"""
