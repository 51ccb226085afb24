"""Every label and annotation key gpuplane reads or writes, in one place.

Kueue's keys keep Kueue's spelling, so a cluster set up for Kueue works unchanged. gpuplane's
own keys live under ``gpuplane.dev/``. Other modules import these names; they never spell a key
themselves (device resource names and GPU Feature Discovery labels are configuration, see
:class:`gpuplane.core.placement.devices.DeviceConfig`).
"""

from __future__ import annotations

KUEUE_GROUP = "kueue.x-k8s.io"

# --- Kueue's keys, on jobs and pods ---------------------------------------------------------
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"  # LocalQueue of a job or pod (label or annotation)
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"  # WorkloadPriorityClass of a job
POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"  # plain pods that form one gang
POD_GROUP_COUNT = "kueue.x-k8s.io/pod-group-total-count"  # annotation: pods in that gang
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"  # on a Workload: the uid of the job that owns it
CLUSTER_QUEUE_LABEL = "kueue.x-k8s.io/cluster-queue-name"  # on an admitted job's pods
LOCAL_QUEUE_LABEL = "kueue.x-k8s.io/local-queue-name"  # on an admitted job's pods
MIN_PARALLELISM = "kueue.x-k8s.io/job-min-parallelism"  # annotation: a Job's minCount
# Annotation: a partially admitted Job's completions follow its admitted parallelism.
COMPLETIONS_EQUAL_PARALLELISM = "kueue.x-k8s.io/job-completions-equal-parallelism"
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"  # pod template annotation
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"  # pod template annotation
# On a pod: the Workload (same namespace) it belongs to. The core reads it to tie a bound pod
# to its admitted workload, so the workload is not counted twice (pods and admission) and a
# victim's pods are freed in a preemption search.
KUEUE_WORKLOAD_LABEL = "kueue.x-k8s.io/workload-name"

# --- Kubernetes', Karpenter's, Kubeflow's and the provisioning API's keys -----------------
HOSTNAME_LABEL = "kubernetes.io/hostname"
KARPENTER_NODEPOOL_LABEL = "karpenter.sh/nodepool"
KARPENTER_DISRUPTED_TAINT = "karpenter.sh/disrupted"
KARPENTER_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
CONSUME_PROVISIONING_REQUEST_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
PROVISIONING_CLASS_ANNOTATION = "autoscaling.x-k8s.io/provisioning-class-name"
# RFC 3339, set by Kubeflow's notebook culler.
KUBEFLOW_LAST_ACTIVITY_ANNOTATION = "notebooks.kubeflow.org/last-activity"

# --- gpuplane's own keys ---------------------------------------------------------------------
# On a released job's pod templates: the admitted Workload and the pod set the pods belong to.
# The webhook manages pods that carry WORKLOAD_LABEL.
WORKLOAD_LABEL = "gpuplane.dev/workload"
PODSET_LABEL = "gpuplane.dev/podset"
ADMISSION_GATE = "gpuplane.dev/admission"  # scheduling gate of queued plain pods
SCHEDULER_NAME = "gpuplane"  # spec.schedulerName of the pods gpuplane binds
DEVICES_ANNOTATION = "gpuplane.dev/devices"  # on a bound pod: the devices the plan gave it
# On a Workload: the devices planned for each pod (gpuplane.model.records.placement_record).
PLACEMENT_ANNOTATION = "gpuplane.dev/placement"
CHECKPOINT_ANNOTATION = "gpuplane.dev/last-checkpoint"  # on a Workload: RFC 3339 time
REPLICAS_BEFORE_RECLAIM_ANNOTATION = "gpuplane.dev/replicas-before-reclaim"
WARM_NODES_ANNOTATION = "gpuplane.dev/warm-nodes"
WARM_NODE_GPUS_ANNOTATION = "gpuplane.dev/warm-node-gpus"
WARM_BUFFER_LABEL = "gpuplane.dev/warm-buffer"  # on placeholder pods: the flavor they keep warm
ETA_ANNOTATION = "gpuplane.dev/eta"
ETA_DETAIL_ANNOTATION = "gpuplane.dev/eta-detail"
PROVISIONING_WORKLOAD_LABEL = "gpuplane.dev/provisioning-workload"
PROVISIONING_CHECK_LABEL = "gpuplane.dev/provisioning-check"
PROVISIONING_ATTEMPT_LABEL = "gpuplane.dev/provisioning-attempt"
RESERVED_AT_ANNOTATION = "gpuplane.dev/reserved-at"
CHECKPOINT_REQUESTED_ANNOTATION = "gpuplane.dev/checkpoint-requested"
CHECKPOINT_DEADLINE_ANNOTATION = "gpuplane.dev/checkpoint-deadline"
CHECKPOINT_GRACE_ANNOTATION = "gpuplane.dev/checkpoint-grace-seconds"
POOL_LABEL = "gpuplane.dev/pool"
REAPER_OPT_OUT_ANNOTATION = "gpuplane.dev/reaper"  # "disabled" opts a pod or its owner out
KEEP_UNTIL_ANNOTATION = "gpuplane.dev/keep-until"  # RFC 3339: no reclaim before this time
RECLAIM_AT_ANNOTATION = "gpuplane.dev/reclaim-at"  # RFC 3339, written by the warning
SESSION_LABEL = "gpuplane.dev/session"  # "true" marks a pod or owner as an interactive session
INTERACTIVE_ANNOTATION = "gpuplane.dev/interactive"  # "true" on a LocalQueue/ClusterQueue
REAPER_WINDOW_ANNOTATION = "gpuplane.dev/reaper-window"
REAPER_GRACE_ANNOTATION = "gpuplane.dev/reaper-grace"
REAPER_THRESHOLD_ANNOTATION = "gpuplane.dev/reaper-threshold"
ISOLATION_LABEL = "gpuplane.dev/isolation"
EXPECTED_RUNTIME_ANNOTATION = "gpuplane.dev/expected-runtime"
# A share of one GPU (pod template annotations; the first present counts, KAI's spelling too) and
# the resource a share is charged under in quota, in thousandths of a GPU (see model.gpu_share).
GPU_FRACTION_ANNOTATIONS = ("gpuplane.dev/gpu-fraction", "gpu-fraction")
GPU_MEMORY_ANNOTATIONS = ("gpuplane.dev/gpu-memory", "gpu-memory")
GPU_FRACTION_RESOURCE = "gpuplane.dev/gpu-fraction"
WORKLOAD_CLASS_LABEL = "gpuplane.dev/workload-class"  # "serving" keeps a workload off spot-only flavors

# --- MultiKueue's keys (Kueue's spelling), on the objects a manager copies to a worker ----------
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"  # an AdmissionCheck's controllerName; a Job's managedBy
MULTIKUEUE_ORIGIN_LABEL = "kueue.x-k8s.io/multikueue-origin"  # on a worker's copies: the manager's origin
MULTIKUEUE_ORIGIN_UID_ANNOTATION = "kueue.x-k8s.io/multikueue-origin-uid"  # the manager object's uid
# On a worker's Job: the Workload (same namespace) made for it in advance, which it adopts.
PREBUILT_WORKLOAD_LABEL = "kueue.x-k8s.io/prebuilt-workload-name"
