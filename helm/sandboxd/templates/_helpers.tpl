{{- define "sandboxd.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sandboxd.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sandboxd.headless" -}}
{{- printf "%s-nodes" (include "sandboxd.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sandboxd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sandboxd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node
{{- end -}}

{{/* Labels of everything the chart makes, but the component (node or redis). */}}
{{- define "sandboxd.baseLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: sandboxd
app.kubernetes.io/name: {{ include "sandboxd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sandboxd.labels" -}}
{{ include "sandboxd.baseLabels" . }}
app.kubernetes.io/component: node
{{- end -}}

{{- define "sandboxd.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "sandboxd.redisUrl" -}}
{{- if .Values.redis.bundled -}}
{{- printf "redis://%s-redis:6379/0" (include "sandboxd.fullname" .) -}}
{{- else -}}
{{- required "redis.url is required when redis.bundled is false" .Values.redis.url -}}
{{- end -}}
{{- end -}}

{{- define "sandboxd.keysSecret" -}}
{{- default (printf "%s-api-keys" (include "sandboxd.fullname" .)) .Values.apiKeys.existingSecret -}}
{{- end -}}

{{/* The preStop drain, the steps' own grace at SIGTERM, and a margin: how long Kubernetes must wait. */}}
{{- define "sandboxd.terminationGrace" -}}
{{- add (int .Values.drain.timeoutSeconds) (int (default "10" .Values.config.SHUTDOWN_GRACE_S)) 15 -}}
{{- end -}}

{{/* The pod of one node, for both modes; "nodeId"/"nodeUrl" come from the mode's template. */}}
{{- define "sandboxd.podSpec" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- with $v.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
terminationGracePeriodSeconds: {{ include "sandboxd.terminationGrace" $root }}
enableServiceLinks: false
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if and $v.images.enabled $v.images.pull }}
initContainers:
  # The images the node serves, pulled into its store before it starts (docs/deploy.md, "Container images").
  - name: images
    image: {{ include "sandboxd.image" $root }}
    imagePullPolicy: {{ $v.image.pullPolicy }}
    command:
      - sh
      - -c
      - 'for ref in "$@"; do sandboxd image pull {{ if $v.images.insecure }}--insecure {{ end }}"$ref" || exit 1; done'
      - pull
      {{- range $v.images.pull }}
      - {{ . | quote }}
      {{- end }}
    env:
      {{- include "sandboxd.imagesEnv" $root | nindent 6 }}
    securityContext:
      runAsUser: 0
      runAsGroup: 0
      allowPrivilegeEscalation: false
      capabilities:
        drop: ["ALL"]
        add: ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "MKNOD"]
    volumeMounts:
      {{- include "sandboxd.imagesMounts" $root | nindent 6 }}
{{- end }}
containers:
  - name: sandboxd
    image: {{ include "sandboxd.image" $root }}
    imagePullPolicy: {{ $v.image.pullPolicy }}
    ports:
      - name: http
        containerPort: {{ $v.service.port }}
        protocol: TCP
      - name: probes
        containerPort: {{ $v.service.probePort }}
        protocol: TCP
    env:
      - name: POD_NAME
        valueFrom: {fieldRef: {fieldPath: metadata.name}}
      - name: POD_NAMESPACE
        valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
      - name: POD_IP
        valueFrom: {fieldRef: {fieldPath: status.podIP}}
      - name: K8S_NODE_NAME
        valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
      - name: SANDBOXD_NODE_ID
        value: {{ .nodeId | quote }}
      - name: SANDBOXD_NODE_URL
        value: {{ .nodeUrl | quote }}
      - name: SANDBOXD_HOST
        value: "0.0.0.0"
      - name: SANDBOXD_PORT
        value: {{ $v.service.port | quote }}
      - name: SANDBOXD_WORKERS
        value: {{ $v.vcpus | quote }}
      - name: SANDBOXD_FRONTS
        value: {{ $v.fronts | default 0 | quote }}
      - name: SANDBOXD_PROBE_PORT
        value: {{ $v.service.probePort | quote }}
      - name: SANDBOXD_REDIS_URL
        value: {{ include "sandboxd.redisUrl" $root | quote }}
      - name: SANDBOXD_API_KEYS_FILE
        value: /etc/sandboxd/keys/{{ $v.apiKeys.key }}
      - name: SANDBOXD_SHUTDOWN_DRAIN_S
        value: "2"
      {{- if $v.images.enabled }}
      {{- include "sandboxd.imagesEnv" $root | nindent 6 }}
      {{- end }}
    envFrom:
      - configMapRef:
          name: {{ include "sandboxd.fullname" $root }}
    resources:
      requests:
        cpu: {{ $v.vcpus | quote }}
        memory: {{ printf "%dMi" (mul (int $v.vcpus) (int $v.memoryPerVcpuMi)) }}
        ephemeral-storage: {{ printf "%dMi" (int $v.ephemeralStorageMi) }}
      limits:
        cpu: {{ $v.vcpus | quote }}
        memory: {{ printf "%dMi" (mul (int $v.vcpus) (int $v.memoryPerVcpuMi)) }}
        ephemeral-storage: {{ printf "%dMi" (int $v.ephemeralStorageMi) }}
    securityContext:
      runAsUser: 0
      runAsGroup: 0
      {{- if eq $v.security.mode "privileged" }}
      privileged: true
      {{- else }}
      privileged: false
      allowPrivilegeEscalation: true
      capabilities:
        drop: ["ALL"]
        add: ["SYS_ADMIN", "SETUID", "SETGID", "KILL", "NET_ADMIN", "CHOWN", "DAC_OVERRIDE", "FOWNER", "SETPCAP", "SYS_RESOURCE", "SYS_PTRACE"]
      seccompProfile:
        type: Unconfined
      appArmorProfile:
        type: Unconfined
      {{- end }}
    # Probes on the node process's own listener: client connections, however many, cannot starve them.
    startupProbe:
      httpGet: {path: /healthz, port: probes}
      periodSeconds: 2
      failureThreshold: 90
    readinessProbe:
      httpGet: {path: /readyz, port: probes}
      periodSeconds: 5
      timeoutSeconds: 3
      failureThreshold: 2
    livenessProbe:
      httpGet: {path: /healthz, port: probes}
      periodSeconds: 10
      timeoutSeconds: 5
      failureThreshold: 3
    lifecycle:
      preStop:
        exec:
          command:
            - sandboxd
            - drain
            - --url
            - http://127.0.0.1:{{ $v.service.port }}
            - --timeout
            - {{ $v.drain.timeoutSeconds | quote }}
            {{- if $v.drain.waitForSessions }}
            - --sessions
            {{- end }}
    volumeMounts:
      - name: api-keys
        mountPath: /etc/sandboxd/keys
        readOnly: true
      - name: scratch
        mountPath: /tmp
      {{- if $v.images.enabled }}
      {{- include "sandboxd.imagesMounts" $root | nindent 6 }}
      {{- end }}
volumes:
  - name: api-keys
    secret:
      secretName: {{ include "sandboxd.keysSecret" $root }}
      defaultMode: 0400
  - name: scratch
    emptyDir:
      sizeLimit: {{ printf "%dMi" (int $v.ephemeralStorageMi) }}
  {{- if $v.images.enabled }}
  - name: images
    {{- if $v.images.hostPath }}
    hostPath:
      path: {{ $v.images.hostPath }}
      type: DirectoryOrCreate
    {{- else }}
    emptyDir:
      sizeLimit: {{ $v.images.sizeLimit }}
    {{- end }}
  {{- if $v.images.registrySecret }}
  - name: registry-auth
    secret:
      secretName: {{ $v.images.registrySecret }}
      defaultMode: 0400
      items:
        - key: .dockerconfigjson
          path: config.json
  {{- end }}
  {{- end }}
{{- end -}}

{{/* The image store's settings and mounts, the node's and the init container's alike. */}}
{{- define "sandboxd.imagesEnv" -}}
- name: SANDBOXD_IMAGES_DIR
  value: /var/lib/sandboxd/images/store
{{- if .Values.images.registrySecret }}
- name: REGISTRY_AUTH_FILE
  value: /etc/sandboxd/registry/config.json
{{- end }}
{{- end -}}

{{- define "sandboxd.imagesMounts" -}}
- name: images
  mountPath: /var/lib/sandboxd/images
{{- if .Values.images.registrySecret }}
- name: registry-auth
  mountPath: /etc/sandboxd/registry
  readOnly: true
{{- end }}
{{- end -}}
