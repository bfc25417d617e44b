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

{{/* The Secret holding the bearer token (made by the chart unless auth.existingSecret). */}}
{{- define "otel-plumb.authSecretName" -}}
{{- default (printf "%s-auth" (include "otel-plumb.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{/* The Secret holding the listeners' certificate (made by the chart unless tls.secretName). */}}
{{- define "otel-plumb.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "otel-plumb.fullname" .)) .Values.tls.secretName }}
{{- end }}

{{/* The name clients check the listeners' certificate against (they connect to pod IPs). */}}
{{- define "otel-plumb.tlsServerName" -}}
{{ include "otel-plumb.fullname" . }}-headless.{{ .Release.Namespace }}.svc
{{- end }}

{{/* The auth, tls and insecure keys of a listener reachable from outside the pod. */}}
{{- define "otel-plumb.protection" -}}
{{- $out := dict }}
{{- if .Values.auth.enabled }}
{{- $token := dict "token_file" "/etc/otel-plumb/auth/token" }}
{{- with .Values.auth.tenant }}{{ $_ := set $token "tenant" . }}{{ end }}
{{- $_ := set $out "auth" (dict "bearer_tokens" (list $token)) }}
{{- end }}
{{- if .Values.tls.enabled }}
{{- $tls := dict "cert_file" "/etc/otel-plumb/tls/tls.crt" "key_file" "/etc/otel-plumb/tls/tls.key" }}
{{- if .Values.tls.clientAuth }}{{ $_ := set $tls "client_ca_file" "/etc/otel-plumb/tls/ca.crt" }}{{ end }}
{{- $_ := set $out "tls" $tls }}
{{- end }}
{{- if .Values.insecure }}{{ $_ := set $out "insecure" true }}{{ end }}
{{- toYaml $out }}
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
{{- if not (or .Values.auth.enabled .Values.tls.enabled .Values.insecure) }}
{{- fail "the listeners beyond loopback need auth.enabled or tls.enabled (or insecure: true to run them unprotected)" }}
{{- end }}
{{- $protection := include "otel-plumb.protection" . | fromYaml }}
{{- $grpc := dict "endpoint" (printf "%s:%v" $listen .Values.ports.otlpGrpc) }}
{{- $http := dict "endpoint" (printf "%s:%v" $listen .Values.ports.otlpHttp) }}
{{- if eq .Values.mode "gateway" }}
{{- $grpc = mustMerge $grpc (deepCopy $protection) }}
{{- $http = mustMerge $http (deepCopy $protection) }}
{{- end }}
{{- /* Kubelet probes cannot present a client certificate: metrics has TLS without mTLS. */}}
{{- $metricsProtection := deepCopy $protection }}
{{- if hasKey $metricsProtection "tls" }}{{ $_ := unset $metricsProtection.tls "client_ca_file" }}{{ end }}
{{- $generated := dict
  "receivers" (dict "grpc" $grpc "http" $http)
  "metrics" (mustMerge (dict "endpoint" (printf "0.0.0.0:%v" .Values.ports.metrics)) $metricsProtection)
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
{{- $scheme := ternary ", scheme: HTTPS" "" .Values.tls.enabled }}
livenessProbe:
  httpGet: {path: /healthz, port: {{ $metrics }}{{ $scheme }}}
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /readyz, port: {{ $metrics }}{{ $scheme }}}
  periodSeconds: 5
  failureThreshold: 2
startupProbe:
  httpGet: {path: /healthz, port: {{ $metrics }}{{ $scheme }}}
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
  {{- if .Values.auth.enabled }}
  - {name: otel-plumb-auth, mountPath: /etc/otel-plumb/auth, readOnly: true}
  {{- end }}
  {{- if .Values.tls.enabled }}
  - {name: otel-plumb-tls, mountPath: /etc/otel-plumb/tls, readOnly: true}
  {{- end }}
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
{{- if .Values.auth.enabled }}
# Mounted as a directory (no subPath) so a rotated Secret reaches the processor, which re-reads the file.
- name: otel-plumb-auth
  secret:
    secretName: {{ include "otel-plumb.authSecretName" . }}
    items:
      - {key: {{ .Values.auth.secretKey }}, path: token}
{{- end }}
{{- if .Values.tls.enabled }}
- name: otel-plumb-tls
  secret:
    secretName: {{ include "otel-plumb.tlsSecretName" . }}
{{- end }}
{{- end }}
