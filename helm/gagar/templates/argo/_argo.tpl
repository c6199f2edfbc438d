{{/* Name of the ConfigMap holding the S3 artifact repository the workflows reference. */}}
{{- define "gagar.argo.artifactRepositoryName" -}}
{{- $repo := .Values.argo.artifactRepository -}}
{{- if $repo.create -}}
{{- printf "%s-argo-artifacts" (include "gagar.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- required "argo.artifactRepository.configMapName must name an existing ConfigMap when argo.artifactRepository.create is false" $repo.configMapName -}}
{{- end -}}
{{- end -}}
