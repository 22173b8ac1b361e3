{{/* Chart name, truncated to the 63 characters Kubernetes allows. */}}
{{- define "edgefleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: <release>-<chart> unless the release already names it. */}}
{{- define "edgefleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "edgefleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "edgefleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "edgefleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "edgefleet.labels" -}}
helm.sh/chart: {{ include "edgefleet.chart" . }}
{{ include "edgefleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: control-plane
{{- end }}

{{- define "edgefleet.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "edgefleet.pvcName" -}}
{{- default (printf "%s-data" (include "edgefleet.fullname" .)) .Values.persistence.existingClaim }}
{{- end }}

{{/* Several replicas are refused unless they can share state (see values.yaml). */}}
{{- define "edgefleet.validate" -}}
{{- if gt (int .Values.replicaCount) 1 }}
{{- if not (or .Values.database.url .Values.database.existingSecret) }}
{{- fail "replicaCount > 1 needs PostgreSQL: set database.url or database.existingSecret" }}
{{- end }}
{{- if not (or .Values.artifacts.url .Values.artifacts.existingSecret) }}
{{- fail "replicaCount > 1 needs S3 storage: set artifacts.url or artifacts.existingSecret" }}
{{- end }}
{{- if not .Values.onlineKeys.existingSecret }}
{{- fail "replicaCount > 1 needs the same online keys in every replica: set onlineKeys.existingSecret" }}
{{- end }}
{{- if not .Values.identityKeys.existingSecret }}
{{- fail "replicaCount > 1 needs one node CA and director key in every replica: set identityKeys.existingSecret" }}
{{- end }}
{{- end }}
{{- end }}
