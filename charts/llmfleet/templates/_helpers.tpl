{{/* Names, labels and small helpers shared by every template. */}}

{{- define "llmfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: <release>-llmfleet, or the release name when it already contains the chart name. */}}
{{- define "llmfleet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "llmfleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: stable across upgrades (Deployment selectors are immutable). */}}
{{- define "llmfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llmfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* Labels on every object the chart renders. The operator's children carry managed-by: llmfleet instead. */}}
{{- define "llmfleet.labels" -}}
helm.sh/chart: {{ include "llmfleet.chart" . }}
app.kubernetes.io/name: {{ include "llmfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: llmfleet
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "llmfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "llmfleet.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* An image reference from {repository, tag, digest}: the digest wins, the tag defaults to appVersion.
     Usage: include "llmfleet.image" (list .Values.image .Chart.AppVersion) */}}
{{- define "llmfleet.image" -}}
{{- $img := index . 0 -}}
{{- $appVersion := index . 1 -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (default $appVersion $img.tag | toString) -}}
{{- end -}}
{{- end -}}

{{/* Cluster-wide unless watchNamespaces is set. */}}
{{- define "llmfleet.clusterWide" -}}
{{- if .Values.operator.watchNamespaces -}}false{{- else -}}true{{- end -}}
{{- end -}}
