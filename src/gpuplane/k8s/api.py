"""The resources the controller and the console use, by group, version and plural.

The client itself (:class:`KubeApi`, :class:`Resource`, :class:`ApiError`, :func:`load_api_client`)
is :mod:`gpuplane.kube.client`'s, shared with the reaper; it is re-exported here for the drivers
that name their resources from this module.
"""

from __future__ import annotations

from gpuplane.kube.client import ApiError, KubeApi, Resource, load_api_client

__all__ = ["ApiError", "KubeApi", "Resource", "load_api_client"]

KUEUE = "kueue.x-k8s.io"
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
PODS = Resource("", "v1", "pods", "Pod")
EVENTS = Resource("", "v1", "events", "Event")
JOBS = Resource("batch", "v1", "jobs", "Job")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
CONFIG_MAPS = Resource("", "v1", "configmaps", "ConfigMap")
SUBJECT_ACCESS_REVIEWS = Resource(
    "authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", namespaced=False
)
CLUSTER_QUEUES = Resource(KUEUE, "v1beta2", "clusterqueues", "ClusterQueue", namespaced=False)
LOCAL_QUEUES = Resource(KUEUE, "v1beta2", "localqueues", "LocalQueue")
RESOURCE_FLAVORS = Resource(KUEUE, "v1beta2", "resourceflavors", "ResourceFlavor", namespaced=False)
COHORTS = Resource(KUEUE, "v1beta2", "cohorts", "Cohort", namespaced=False)
WORKLOADS = Resource(KUEUE, "v1beta2", "workloads", "Workload")
PRIORITY_CLASSES = Resource(
    KUEUE, "v1beta2", "workloadpriorityclasses", "WorkloadPriorityClass", namespaced=False
)
TOPOLOGIES = Resource(KUEUE, "v1beta2", "topologies", "Topology", namespaced=False)
MULTIKUEUE_CLUSTERS = Resource(KUEUE, "v1beta2", "multikueueclusters", "MultiKueueCluster", namespaced=False)
MULTIKUEUE_CONFIGS = Resource(KUEUE, "v1beta2", "multikueueconfigs", "MultiKueueConfig", namespaced=False)
SECRETS = Resource("", "v1", "secrets", "Secret")
ADMISSION_CHECKS = Resource(KUEUE, "v1beta2", "admissionchecks", "AdmissionCheck", namespaced=False)
PROVISIONING_CONFIGS = Resource(
    KUEUE, "v1beta2", "provisioningrequestconfigs", "ProvisioningRequestConfig", namespaced=False
)
PROVISIONING_REQUESTS = Resource("autoscaling.x-k8s.io", "v1", "provisioningrequests", "ProvisioningRequest")
POD_TEMPLATES = Resource("", "v1", "podtemplates", "PodTemplate")
NODE_POOLS = Resource("karpenter.sh", "v1", "nodepools", "NodePool", namespaced=False)
JOBSETS = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
PYTORCH_JOBS = Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
TRAIN_JOBS = Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob")
RAY_JOBS = Resource("ray.io", "v1", "rayjobs", "RayJob")
DRA = "resource.k8s.io"
DEVICE_CLASSES = Resource(DRA, "v1", "deviceclasses", "DeviceClass", namespaced=False)
RESOURCE_SLICES = Resource(DRA, "v1", "resourceslices", "ResourceSlice", namespaced=False)
RESOURCE_CLAIMS = Resource(DRA, "v1", "resourceclaims", "ResourceClaim")
RESOURCE_CLAIM_TEMPLATES = Resource(DRA, "v1", "resourceclaimtemplates", "ResourceClaimTemplate")
# Served as v1 from Kubernetes 1.37 (1.36 serves v1beta2 behind a feature gate only, as Kueue reads it).
DEVICE_TAINT_RULES = Resource(DRA, "v1", "devicetaintrules", "DeviceTaintRule", namespaced=False)
LEADER_WORKER_SETS = Resource("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet")
