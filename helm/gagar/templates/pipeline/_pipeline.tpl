{{/* A container running the gagar CLI with the release's settings; call with (dict "context" $). */}}
{{- define "gagar.pipeline.cliContainer" -}}
{{- $values := .context.Values -}}
image: {{ include "gagar.images.stage" (dict "context" .context "stage" $values.pipeline.upload.image) }}
imagePullPolicy: {{ $values.images.pullPolicy }}
command: ["gagar"]
envFrom:
  - configMapRef:
      name: {{ include "gagar.pipeline.settingsName" .context }}
env:
  # the root filesystem is read-only: caches and config go to the /tmp emptyDir
  - name: HOME
    value: /tmp
  {{- if $values.pipeline.kfpServiceAccountToken }}
  - name: KF_PIPELINES_SA_TOKEN_PATH
    value: /var/run/secrets/kubeflow/pipelines/token
  {{- end }}
securityContext:
  {{- toYaml $values.containerSecurityContext | nindent 2 }}
resources:
  {{- toYaml $values.pipeline.upload.resources | nindent 2 }}
volumeMounts:
  - name: tmp
    mountPath: /tmp
  {{- if has $values.pipeline.package.source (list "inline" "configMap") }}
  - name: pipeline-package
    mountPath: /pipeline
    readOnly: true
  {{- end }}
  {{- if $values.pipeline.kfpServiceAccountToken }}
  - name: kfp-token
    mountPath: /var/run/secrets/kubeflow/pipelines
    readOnly: true
  {{- end }}
{{- end -}}
