{{/*
Names, labels and images shared by every template. Helpers are named gagar.<component>.<thing>.
*/}}

{{/* Chart name, truncated to the 63 characters a DNS label allows. */}}
{{- define "gagar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: the release name, suffixed with the chart name unless it already contains it. */}}
{{- define "gagar.fullname" -}}
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

{{/* Chart name and version, as the helm.sh/chart label wants them. */}}
{{- define "gagar.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object; call with (dict "context" $ "component" "<component>"). */}}
{{- define "gagar.labels" -}}
helm.sh/chart: {{ include "gagar.chart" .context }}
{{ include "gagar.selectorLabels" . }}
app.kubernetes.io/version: {{ .context.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .context.Release.Service }}
app.kubernetes.io/part-of: gagar
{{- with .context.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels; call with (dict "context" $ "component" "<component>"). */}}
{{- define "gagar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gagar.name" .context }}
app.kubernetes.io/instance: {{ .context.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Image reference of a stage; call with (dict "context" $ "stage" "<stage>"). */}}
{{- define "gagar.images.stage" -}}
{{- $images := .context.Values.images -}}
{{- $stage := index $images .stage -}}
{{- $tag := $stage.tag | default $images.tag | default .context.Chart.AppVersion -}}
{{- printf "%s/%s:%s" $images.registry $stage.repository $tag -}}
{{- end -}}

{{/* Name of the sandbox namespace. */}}
{{- define "gagar.sandbox.namespace" -}}
{{- default (printf "%s-sandbox" .Release.Name) .Values.sandbox.namespace.name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Name of the ServiceAccount pipeline runs use. */}}
{{- define "gagar.sandbox.serviceAccountName" -}}
{{- if .Values.sandbox.serviceAccount.create -}}
{{- default (printf "%s-runner" (include "gagar.fullname" .)) .Values.sandbox.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.sandbox.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Pipeline root the kfp-launcher ConfigMap declares. */}}
{{- define "gagar.kfp.pipelineRoot" -}}
{{- $store := .Values.objectStore -}}
{{- default (printf "s3://%s/%s" $store.bucket $store.prefix) .Values.kfpLauncher.defaultPipelineRoot -}}
{{- end -}}

{{/* Base URL of the object store as clients address it. */}}
{{- define "gagar.objectStore.url" -}}
{{- $store := .Values.objectStore -}}
{{- printf "%s://%s" (ternary "http" "https" $store.disableSSL) $store.endpoint -}}
{{- end -}}

{{/* Name of the Pushgateway Deployment and Service. */}}
{{- define "gagar.pushgateway.fullname" -}}
{{- printf "%s-pushgateway" (include "gagar.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* URL of the Pushgateway inside the cluster (the pipeline's `pushgateway` parameter). */}}
{{- define "gagar.pushgateway.url" -}}
{{- printf "http://%s.%s.svc:9091" (include "gagar.pushgateway.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/*
Subjects bound to the sandbox Role and the runner Role: the chart's ServiceAccount, the accounts
KFP runs UI-submitted runs under (sandbox.rbac.kfpServiceAccounts) and sandbox.rbac.extraSubjects.
*/}}
{{- define "gagar.rbac.subjects" -}}
- kind: ServiceAccount
  name: {{ include "gagar.sandbox.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- $own := include "gagar.sandbox.serviceAccountName" . }}
{{- range .Values.sandbox.rbac.kfpServiceAccounts }}
{{- if ne . $own }}
- kind: ServiceAccount
  name: {{ . }}
  namespace: {{ $.Release.Namespace }}
{{- end }}
{{- end }}
{{- with .Values.sandbox.rbac.extraSubjects }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
Whether the cluster's Kubernetes is at least the given version, e.g. `include "gagar.kube.atLeast" (list . "1.23")`:
what older servers lack (a field or an API) is rendered only where it exists.
*/}}
{{- define "gagar.kube.atLeast" -}}
{{- $ctx := index . 0 -}}
{{- if semverCompare (printf ">=%s-0" (index . 1)) $ctx.Capabilities.KubeVersion.Version -}}true{{- end -}}
{{- end -}}

{{/* Whether the cluster serves the Prometheus operator API. */}}
{{- define "gagar.monitoring.apiAvailable" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" -}}true{{- end -}}
{{- end -}}

{{/* Name of the settings ConfigMap the upload Job (and users' own jobs) read. */}}
{{- define "gagar.pipeline.settingsName" -}}
{{- printf "%s-settings" (include "gagar.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Name of the pipeline in KFP: one per release, so two releases sharing a KFP never upload versions
of one pipeline under the same version name (KFP refuses the second). */}}
{{- define "gagar.pipeline.name" -}}
{{- default (printf "%s-rl" (include "gagar.fullname" .)) .Values.pipeline.name -}}
{{- end -}}

{{/* Name of the recurring run: one per release (a schedule replaces the one of its name in its experiment). */}}
{{- define "gagar.pipeline.recurringRunName" -}}
{{- default (printf "%s-rl-nightly" (include "gagar.fullname" .)) .Values.pipeline.recurringRun.name -}}
{{- end -}}

{{/* Name of the ClusterTrainingRuntime the chart installs (the pipeline's train_runtime). */}}
{{- define "gagar.trainer.runtimeName" -}}
{{- default (printf "%s-torch" (include "gagar.fullname" .)) .Values.trainer.runtimeName | trunc 63 | trimSuffix "-" -}}
{{- end -}}
