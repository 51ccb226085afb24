{{/* Chart name, cut to 63 characters. */}}
{{- define "gpuplane.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Base name of the release's objects: the release name, or release-chart when they differ. */}}
{{- define "gpuplane.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "gpuplane.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "gpuplane.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component; call with (dict "ctx" $ "component" "controller"). */}}
{{- define "gpuplane.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuplane.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gpuplane.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "gpuplane.serviceAccountName" -}}
{{- printf "%s-controller" (include "gpuplane.fullname" .) }}
{{- end }}

{{- define "gpuplane.webhookName" -}}
{{- printf "%s-webhook" (include "gpuplane.fullname" .) }}
{{- end }}
