{{/* Chart name, truncated to the 63 characters Kubernetes allows in a label value. */}}
{{- define "switchyard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: <release> if it contains the chart name, else <release>-<chart>. */}}
{{- define "switchyard.fullname" -}}
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

{{- define "switchyard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "switchyard.labels" -}}
helm.sh/chart: {{ include "switchyard.chart" . }}
app.kubernetes.io/name: {{ include "switchyard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: switchyard
{{- end }}

{{/* Selector labels of one component: include "switchyard.selectorLabels" (list $ "engine") */}}
{{- define "switchyard.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "switchyard.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "switchyard.engineName" -}}
{{- printf "%s-engine" (include "switchyard.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "switchyard.gatewayName" -}}
{{- printf "%s-gateway" (include "switchyard.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The engine Service's OpenAI base URL: the default upstream of the gateway's remote models. */}}
{{- define "switchyard.engineURL" -}}
{{- printf "http://%s:%v/v1" (include "switchyard.engineName" .) .Values.server.httpPort }}
{{- end }}

{{/* Image of a component: include "switchyard.image" (list $ .Values.engine.image) */}}
{{- define "switchyard.image" -}}
{{- $root := index . 0 -}}
{{- $override := index . 1 | default dict -}}
{{- $repo := $override.repository | default $root.Values.image.repository -}}
{{- $tag := $override.tag | default $root.Values.image.tag | default $root.Chart.AppVersion -}}
{{- printf "%s:%s" $repo $tag }}
{{- end }}

{{/* The `switchyard serve` command line (container args). */}}
{{- define "switchyard.args" -}}
- --model-repository
- {{ .Values.server.modelRepository | quote }}
- --host
- "0.0.0.0"
- --http-port
- {{ .Values.server.httpPort | quote }}
- --grpc-port
- {{ .Values.server.grpcPort | quote }}
- --metrics-port
- {{ .Values.server.metricsPort | quote }}
- --log-level
- {{ .Values.server.logLevel | quote }}
- --log-format
- {{ .Values.server.logFormat | quote }}
- --drain-seconds
- {{ .Values.server.drainSeconds | quote }}
{{- range .Values.server.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{- define "switchyard.containerPorts" -}}
- name: http
  containerPort: {{ .Values.server.httpPort }}
  protocol: TCP
- name: grpc
  containerPort: {{ .Values.server.grpcPort }}
  protocol: TCP
- name: metrics
  containerPort: {{ .Values.server.metricsPort }}
  protocol: TCP
{{- end }}

{{- define "switchyard.servicePorts" -}}
- name: http
  port: {{ .Values.server.httpPort }}
  targetPort: http
  protocol: TCP
- name: grpc
  port: {{ .Values.server.grpcPort }}
  targetPort: grpc
  protocol: TCP
- name: metrics
  port: {{ .Values.server.metricsPort }}
  targetPort: metrics
  protocol: TCP
{{- end }}

{{/* Environment shared by both components. */}}
{{- define "switchyard.env" -}}
- name: SWITCHYARD_CACHE_DIR
  value: {{ .Values.server.cacheDir | quote }}
- name: HF_HOME
  value: {{ printf "%s/huggingface" .Values.server.cacheDir | quote }}
{{- with .Values.auth.existingSecret }}
- name: SWITCHYARD_API_KEYS
  valueFrom:
    secretKeyRef:
      name: {{ . | quote }}
      key: api-keys
      optional: true
- name: SWITCHYARD_ADMIN_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . | quote }}
      key: admin-key
      optional: true
{{- end }}
{{- end }}

{{/* Liveness and readiness probes; include "switchyard.probes" (list $ .Values.engine.startupProbe) */}}
{{- define "switchyard.probes" -}}
{{- $root := index . 0 -}}
{{- $startup := index . 1 -}}
startupProbe:
  httpGet:
    path: {{ $root.Values.probes.livenessPath }}
    port: http
  periodSeconds: {{ $startup.periodSeconds }}
  failureThreshold: {{ $startup.failureThreshold }}
livenessProbe:
  httpGet:
    path: {{ $root.Values.probes.livenessPath }}
    port: http
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: {{ $root.Values.probes.readinessPath }}
    port: http
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 3
{{- end }}

{{- define "switchyard.podAnnotations" -}}
{{- $root := index . 0 -}}
{{- $extra := index . 1 | default dict -}}
{{- $ann := dict -}}
{{- if $root.Values.prometheusAnnotations }}
{{- $_ := set $ann "prometheus.io/scrape" "true" }}
{{- $_ := set $ann "prometheus.io/port" (toString $root.Values.server.metricsPort) }}
{{- $_ := set $ann "prometheus.io/path" "/metrics" }}
{{- end }}
{{- $ann = merge $ann $extra }}
{{- if $ann -}}
annotations:
  {{- toYaml $ann | nindent 2 }}
{{- end }}
{{- end }}
