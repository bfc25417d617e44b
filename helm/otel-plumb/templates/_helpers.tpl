{{- define "otel-plumb.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "otel-plumb.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "otel-plumb.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "otel-plumb.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "otel-plumb.selectorLabels" -}}
app.kubernetes.io/name: {{ include "otel-plumb.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "otel-plumb.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "otel-plumb.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: {{ .Values.mode }}
{{- end }}

{{- define "otel-plumb.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "otel-plumb.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "otel-plumb.secretName" -}}
{{- default (printf "%s-export" (include "otel-plumb.fullname" .)) .Values.export.existingSecret }}
{{- end }}

{{/* Names of the export headers, from the chart's Secret or an existing one. */}}
{{- define "otel-plumb.headerNames" -}}
{{- if .Values.export.existingSecret }}
{{- toYaml .Values.export.existingSecretHeaders }}
{{- else }}
{{- toYaml (keys .Values.export.headers | sortAlpha) }}
{{- end }}
{{- end }}

{{- define "otel-plumb.headerEnv" -}}
{{- printf "OTEL_PLUMB_HEADER_%s" (regexReplaceAll "[^A-Za-z0-9]+" . "_" | upper) }}
{{- end }}

{{/* True when the gateway keeps its state on persistent volumes (then it is a StatefulSet). */}}
{{- define "otel-plumb.workloadKind" -}}
{{- if .Values.persistence.enabled }}StatefulSet{{ else }}Deployment{{ end }}
{{- end }}

{{/* The processor's config file, generated from values. */}}
{{- define "otel-plumb.config" -}}
{{- $listen := ternary "127.0.0.1" "0.0.0.0" (eq .Values.mode "sidecar") }}
{{- $policies := list }}
{{- range $name, $_ := .Values.policies }}
{{- $policies = append $policies (printf "/etc/otel-plumb/policies/%s.yaml" $name) }}
{{- end }}
{{- $generated := dict
  "receivers" (dict
    "grpc" (dict "endpoint" (printf "%s:%v" $listen .Values.ports.otlpGrpc))
    "http" (dict "endpoint" (printf "%s:%v" $listen .Values.ports.otlpHttp)))
  "metrics" (dict "endpoint" (printf "0.0.0.0:%v" .Values.ports.metrics))
  "policies" $policies }}
{{- if .Values.export.endpoint }}
{{- $headers := dict }}
{{- range (include "otel-plumb.headerNames" . | fromYamlArray) }}
{{- $_ := set $headers . (printf "${env:%s}" (include "otel-plumb.headerEnv" .)) }}
{{- end }}
{{- $_ := set $generated "exporters" (dict "otlp" (dict
  "endpoint" .Values.export.endpoint
  "headers" $headers
  "compression" .Values.export.compression
  "state_dir" "/var/lib/otel-plumb")) }}
{{- end }}
{{- if .Values.verdictLog.enabled }}
{{- $_ := set $generated "verdict_log" (dict "path" "/var/lib/otel-plumb/verdicts.jsonl") }}
{{- end }}
{{- toYaml (mustMergeOverwrite (deepCopy .Values.config) $generated) }}
{{- end }}

{{/* The otel-plumb container: the same spec in the gateway and in the sidecar patch. */}}
{{- define "otel-plumb.container" -}}
{{- $metrics := ternary "plumb-metrics" "metrics" (eq .Values.mode "sidecar") -}}
name: otel-plumb
image: {{ printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
args: [run, --config, /etc/otel-plumb/config.yaml, --state-dir, /var/lib/otel-plumb]
ports:
  {{- if eq .Values.mode "gateway" }}
  - {name: otlp-grpc, containerPort: {{ .Values.ports.otlpGrpc }}, protocol: TCP}
  - {name: otlp-http, containerPort: {{ .Values.ports.otlpHttp }}, protocol: TCP}
  {{- end }}
  - {name: {{ $metrics }}, containerPort: {{ .Values.ports.metrics }}, protocol: TCP}
{{- if .Values.export.endpoint }}
env:
  {{- range (include "otel-plumb.headerNames" . | fromYamlArray) }}
  - name: {{ include "otel-plumb.headerEnv" . }}
    valueFrom:
      secretKeyRef:
        name: {{ include "otel-plumb.secretName" $ }}
        key: {{ . }}
  {{- end }}
{{- end }}
livenessProbe:
  httpGet: {path: /healthz, port: {{ $metrics }}}
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /readyz, port: {{ $metrics }}}
  periodSeconds: 5
  failureThreshold: 2
startupProbe:
  httpGet: {path: /healthz, port: {{ $metrics }}}
  periodSeconds: 2
  failureThreshold: 30
resources:
  {{- toYaml .Values.resources | nindent 2 }}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
volumeMounts:
  - {name: otel-plumb-config, mountPath: /etc/otel-plumb/config.yaml, subPath: config.yaml, readOnly: true}
  - {name: otel-plumb-policies, mountPath: /etc/otel-plumb/policies, readOnly: true}
  - {name: otel-plumb-state, mountPath: /var/lib/otel-plumb}
  - {name: otel-plumb-tmp, mountPath: /tmp}
{{- end }}

{{/* Volumes of the container above; the state volume comes from a claim template when persistent. */}}
{{- define "otel-plumb.volumes" -}}
- name: otel-plumb-config
  configMap:
    name: {{ include "otel-plumb.fullname" . }}-config
- name: otel-plumb-policies
  configMap:
    name: {{ include "otel-plumb.fullname" . }}-policies
{{- if not (and .Values.persistence.enabled (eq .Values.mode "gateway")) }}
- name: otel-plumb-state
  emptyDir: {}
{{- end }}
- name: otel-plumb-tmp
  emptyDir:
    medium: Memory
    sizeLimit: 64Mi
{{- end }}
