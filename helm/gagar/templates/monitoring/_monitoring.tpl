{{/*
A ServiceMonitor scraping /metrics of one component's Service. Call with
(dict "context" $ "component" "<component>" "name" "<object name>" "port" "<port name>" "honorLabels" <bool>).
*/}}
{{- define "gagar.monitoring.serviceMonitor" -}}
{{- $sm := .context.Values.monitoring.serviceMonitor -}}
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: {{ .name }}
  namespace: {{ .context.Release.Namespace }}
  labels:
    {{- include "gagar.labels" (dict "context" .context "component" .component) | nindent 4 }}
    {{- with $sm.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  selector:
    matchLabels:
      {{- include "gagar.selectorLabels" (dict "context" .context "component" .component) | nindent 6 }}
  namespaceSelector:
    matchNames:
      - {{ .context.Release.Namespace }}
  endpoints:
    - port: {{ .port }}
      path: /metrics
      interval: {{ $sm.interval }}
      honorLabels: {{ .honorLabels }}
{{- end -}}
