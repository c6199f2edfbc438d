{{/*
A vLLM OpenAI-compatible server (policy or grader). Call with
(dict "context" $ "component" "policy-server" "server" .Values.policyServer).
*/}}

{{/* Name of a vLLM server's Deployment and Service. */}}
{{- define "gagar.vllm.fullname" -}}
{{- printf "%s-%s" (include "gagar.fullname" .context) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Model argument of a vLLM server: a path in its claim, or an s3:// URI streamed at start. */}}
{{- define "gagar.vllm.model" -}}
{{- $model := .server.model -}}
{{- if eq $model.source "s3" -}}
{{- required (printf "%s: model.uri must be set when model.source is s3" .component) $model.uri -}}
{{- else -}}
{{- printf "/models/%s" $model.path -}}
{{- end -}}
{{- end -}}

{{/* The run store the adapter-sync sidecar mirrors adapters from (the pipeline's `storage`). */}}
{{- define "gagar.vllm.adapterStore" -}}
{{- $store := .context.Values.objectStore -}}
{{- default (printf "s3://%s/%s" $store.bucket $store.prefix) .server.lora.sync.storage -}}
{{- end -}}

{{- define "gagar.vllm.deployment" -}}
{{- $ctx := .context -}}
{{- $server := .server -}}
{{- $model := $server.model -}}
{{- $store := $ctx.Values.objectStore -}}
{{- $args := list "--model" (include "gagar.vllm.model" .) "--served-model-name" $model.servedName "--host" "0.0.0.0" "--port" "8000" "--max-model-len" (toString $server.maxModelLen) -}}
{{- if gt (int $server.gpus) 0 -}}
{{- $args = concat $args (list "--tensor-parallel-size" (toString $server.gpus)) -}}
{{- end -}}
{{- if eq $model.source "s3" -}}
{{- $args = concat $args (list "--load-format" "runai_streamer") -}}
{{- end -}}
{{- if $server.lora.enabled -}}
{{- $args = concat $args (list "--enable-lora" "--max-lora-rank" (toString $server.lora.maxRank) "--max-loras" (toString $server.lora.maxLoras)) -}}
{{- end -}}
{{- $args = concat $args $server.extraArgs -}}
{{- $sync := and $server.lora.enabled (dig "sync" "enabled" false $server.lora) -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "gagar.vllm.fullname" . }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- include "gagar.labels" (dict "context" $ctx "component" .component) | nindent 4 }}
spec:
  replicas: {{ $server.replicas }}
  selector:
    matchLabels:
      {{- include "gagar.selectorLabels" (dict "context" $ctx "component" .component) | nindent 6 }}
  strategy:
    # A GPU server cannot surge: free the GPU before the next replica starts.
    type: Recreate
  template:
    metadata:
      labels:
        {{- include "gagar.labels" (dict "context" $ctx "component" .component) | nindent 8 }}
    spec:
      automountServiceAccountToken: false
      {{- with $ctx.Values.images.pullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $ctx.Values.podSecurityContext | nindent 8 }}
      containers:
        - name: vllm
          image: {{ printf "%s:%s" $server.image.repository $server.image.tag }}
          imagePullPolicy: {{ $server.image.pullPolicy }}
          command: ["python3", "-m", "vllm.entrypoints.openai.api_server"]
          args:
            {{- toYaml $args | nindent 12 }}
          ports:
            - name: http
              containerPort: 8000
              protocol: TCP
          env:
            - name: HOME
              value: /cache
            - name: XDG_CACHE_HOME
              value: /cache
            - name: VLLM_CACHE_ROOT
              value: /cache/vllm
            - name: HF_HUB_OFFLINE
              value: "1"
            {{- if eq (int $server.gpus) 0 }}
            - name: VLLM_CPU_KVCACHE_SPACE
              value: {{ $server.cpuKvCacheGiB | quote }}
            {{- end }}
            {{- if $server.lora.enabled }}
            - name: VLLM_ALLOW_RUNTIME_LORA_UPDATING
              value: "True"
            {{- end }}
            {{- if eq $model.source "s3" }}
            - name: AWS_ENDPOINT_URL
              value: {{ include "gagar.objectStore.url" $ctx | quote }}
            - name: AWS_REGION
              value: {{ $store.region | quote }}
            - name: AWS_EC2_METADATA_DISABLED
              value: "true"
            - name: RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING
              value: {{ ternary "0" "1" $store.forcePathStyle | quote }}
            - name: AWS_ACCESS_KEY_ID
              valueFrom:
                secretKeyRef:
                  name: {{ $store.credentials.existingSecret }}
                  key: {{ $store.credentials.accessKeyKey }}
            - name: AWS_SECRET_ACCESS_KEY
              valueFrom:
                secretKeyRef:
                  name: {{ $store.credentials.existingSecret }}
                  key: {{ $store.credentials.secretKeyKey }}
            {{- end }}
            {{- with $server.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          securityContext:
            {{- toYaml $ctx.Values.containerSecurityContext | nindent 12 }}
          resources:
            requests:
              {{- with $server.resources.requests }}
              {{- toYaml . | nindent 14 }}
              {{- end }}
              {{- if gt (int $server.gpus) 0 }}
              nvidia.com/gpu: {{ $server.gpus }}
              {{- end }}
            limits:
              {{- with $server.resources.limits }}
              {{- toYaml . | nindent 14 }}
              {{- end }}
              {{- if gt (int $server.gpus) 0 }}
              nvidia.com/gpu: {{ $server.gpus }}
              {{- end }}
          startupProbe:
            httpGet:
              path: /health
              port: http
            periodSeconds: 10
            failureThreshold: {{ div $server.startupTimeoutSeconds 10 }}
          readinessProbe:
            httpGet:
              path: /health
              port: http
            periodSeconds: 10
            failureThreshold: 3
          livenessProbe:
            httpGet:
              path: /health
              port: http
            periodSeconds: 20
            timeoutSeconds: 5
            failureThreshold: 3
          volumeMounts:
            - name: cache
              mountPath: /cache
            - name: tmp
              mountPath: /tmp
            - name: dshm
              mountPath: /dev/shm
            {{- if eq $model.source "pvc" }}
            - name: models
              mountPath: /models
              readOnly: true
            {{- end }}
            {{- if or $server.lora.adaptersClaim $sync }}
            - name: adapters
              mountPath: /adapters
              readOnly: true
            {{- end }}
        {{- if $sync }}
        # Mirrors the adapters the train stage publishes to the store (adapters/policy-step-N) into
        # /adapters, where the rollout stage has the server load them (gagar serve adapter-sync).
        - name: adapter-sync
          image: {{ include "gagar.images.stage" (dict "context" $ctx "stage" "grader") }}
          imagePullPolicy: {{ $ctx.Values.images.pullPolicy }}
          command: ["gagar", "serve", "adapter-sync"]
          args:
            - --storage
            - {{ include "gagar.vllm.adapterStore" . | quote }}
            - --dest
            - /adapters
            - --interval-s
            - {{ $server.lora.sync.intervalSeconds | quote }}
          env:
            - name: GAGAR_STORAGE__ENDPOINT
              value: {{ include "gagar.objectStore.url" $ctx | quote }}
            - name: GAGAR_STORAGE__REGION
              value: {{ $store.region | quote }}
            - name: AWS_ACCESS_KEY_ID
              valueFrom:
                secretKeyRef:
                  name: {{ $store.credentials.existingSecret }}
                  key: {{ $store.credentials.accessKeyKey }}
            - name: AWS_SECRET_ACCESS_KEY
              valueFrom:
                secretKeyRef:
                  name: {{ $store.credentials.existingSecret }}
                  key: {{ $store.credentials.secretKeyKey }}
          securityContext:
            {{- toYaml $ctx.Values.containerSecurityContext | nindent 12 }}
          resources:
            requests:
              cpu: 50m
              memory: 128Mi
            limits:
              memory: 512Mi
          volumeMounts:
            - name: adapters
              mountPath: /adapters
            - name: tmp
              mountPath: /tmp
        {{- end }}
      volumes:
        - name: cache
          emptyDir: {}
        - name: tmp
          emptyDir: {}
        - name: dshm
          emptyDir:
            medium: Memory
            sizeLimit: {{ $server.shmSize }}
        {{- if eq $model.source "pvc" }}
        - name: models
          persistentVolumeClaim:
            claimName: {{ required (printf "%s: model.existingClaim must name a PersistentVolumeClaim when model.source is pvc" .component) $model.existingClaim }}
            readOnly: true
        {{- end }}
        {{- if $server.lora.adaptersClaim }}
        - name: adapters
          persistentVolumeClaim:
            claimName: {{ $server.lora.adaptersClaim }}
            readOnly: true
        {{- else if $sync }}
        - name: adapters
          emptyDir: {}
        {{- end }}
      {{- with $server.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $server.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $server.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end -}}

{{- define "gagar.vllm.service" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "gagar.vllm.fullname" . }}
  namespace: {{ .context.Release.Namespace }}
  labels:
    {{- include "gagar.labels" (dict "context" .context "component" .component) | nindent 4 }}
spec:
  type: ClusterIP
  selector:
    {{- include "gagar.selectorLabels" (dict "context" .context "component" .component) | nindent 4 }}
  ports:
    - name: http
      port: 8000
      targetPort: http
      protocol: TCP
{{- end -}}
