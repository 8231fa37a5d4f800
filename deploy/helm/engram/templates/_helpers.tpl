{{/* Names and labels ------------------------------------------------------------- */}}

{{- define "engram.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "engram.fullname" -}}
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

{{- define "engram.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release-wide selector: every pod of this release (the default-deny policy). */}}
{{- define "engram.selectorLabels" -}}
app.kubernetes.io/name: {{ include "engram.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "engram.labels" -}}
helm.sh/chart: {{ include "engram.chart" . }}
{{ include "engram.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: engram
{{- end }}

{{/* (list $ "component") */}}
{{- define "engram.componentSelectorLabels" -}}
{{ include "engram.selectorLabels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "engram.componentLabels" -}}
{{ include "engram.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* (list $ "component"): the name of the component's workload and Service. */}}
{{- define "engram.componentFullname" -}}
{{- printf "%s-%s" (include "engram.fullname" (index . 0)) (index . 1) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "engram.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "engram.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "engram.secretName" -}}
{{- default (include "engram.fullname" .) .Values.secrets.existingSecret }}
{{- end }}

{{/* Whether any secret is available to reference (an existing Secret or chart-made). */}}
{{- define "engram.hasSecret" -}}
{{- $s := .Values.secrets }}
{{- if or $s.existingSecret $s.apiKeys $s.llmApiKey $s.qdrantApiKey }}true{{ end }}
{{- end }}

{{/* Components and their merged values -------------------------------------------- */}}

{{/*
Deep merge of (list base override) as YAML: maps merge key by key, anything else in
override replaces. Hand-written because sprig's merge/mergeOverwrite treat false and 0
as "empty" and would let `enabled: true` in `default` win over a component's `false`.
*/}}
{{- define "engram.merge" -}}
{{- $base := index . 0 }}
{{- $over := index . 1 }}
{{- $out := deepCopy $base }}
{{- range $key, $value := $over }}
{{- $current := get $out $key }}
{{- if and (kindIs "map" $value) (kindIs "map" $current) }}
{{- $_ := set $out $key (include "engram.merge" (list $current $value) | fromYaml) }}
{{- else }}
{{- $_ := set $out $key $value }}
{{- end }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/* (list $ "component"): `default` merged with `components.<component>`, as YAML. */}}
{{- define "engram.component" -}}
{{- $root := index . 0 }}
{{- include "engram.merge" (list $root.Values.default (index $root.Values.components (index . 1))) }}
{{- end }}

{{/*
What kind of process a component runs: gateway (HTTP API), retrieval (gRPC) or a
worker (a JetStream consumer with an HTTP health port). Adding a worker is a values
(and schema) entry; it is a worker unless named otherwise here.
*/}}
{{- define "engram.kind" -}}
{{- if eq . "gateway" }}gateway{{ else if eq . "retrieval" }}retrieval{{ else }}worker{{ end }}
{{- end }}

{{/* The process name (engram-<name>) and the worker's durable consumer. */}}
{{- define "engram.process" -}}
{{- if eq . "file-mirror" }}mirror{{ else }}{{ . }}{{ end }}
{{- end }}

{{/* The container port probes and Services use. (list "component" $values) */}}
{{- define "engram.port" -}}
{{- $c := index . 1 }}
{{- if eq (include "engram.kind" (index . 0)) "worker" }}{{ $c.healthPort }}{{ else }}{{ $c.port }}{{ end }}
{{- end }}

{{- define "engram.embeddedStore" -}}
{{- if not .Values.qdrant.url }}true{{ end }}
{{- end }}

{{/* (list $ "component" $values) */}}
{{- define "engram.image" -}}
{{- $root := index . 0 }}
{{- $name := index . 1 }}
{{- $own := default dict (index . 2).image }}
{{- $repo := default (printf "%s/%s" $root.Values.image.repository $name) $own.repository }}
{{- if $root.Values.image.registry }}{{ $repo = printf "%s/%s" $root.Values.image.registry $repo }}{{ end }}
{{- printf "%s:%s" $repo (default (default $root.Chart.AppVersion $root.Values.image.tag) $own.tag) }}
{{- end }}

{{/* Checks the schema cannot express; each fails the render with a clear message. */}}
{{- define "engram.validate" -}}
{{- $retrieval := include "engram.component" (list . "retrieval") | fromYaml }}
{{- if and (include "engram.embeddedStore" .) $retrieval.enabled }}
{{- if gt (int $retrieval.replicas) 1 }}
{{- fail (printf "components.retrieval.replicas is %v but qdrant.url is empty: the embedded store lives on one volume and allows one process. Set qdrant.url to scale retrieval, or replicas: 1." $retrieval.replicas) }}
{{- end }}
{{- if $retrieval.autoscaling.enabled }}
{{- fail "components.retrieval.autoscaling.enabled needs qdrant.url: the embedded store (qdrant.url empty) allows one retrieval process." }}
{{- end }}
{{- end }}
{{- $mirror := include "engram.component" (list . "file-mirror") | fromYaml }}
{{- if gt (int $mirror.replicas) 1 }}
{{- fail (printf "components.file-mirror.replicas is %v: the mirror is the single writer of its git tree; use 0 or 1." $mirror.replicas) }}
{{- end }}
{{- if $mirror.autoscaling.enabled }}
{{- fail "components.file-mirror.autoscaling: the mirror is a single writer and cannot autoscale." }}
{{- end }}
{{- $s := .Values.secrets }}
{{- if and $s.existingSecret (or $s.apiKeys $s.llmApiKey $s.qdrantApiKey) }}
{{- fail "secrets: set either secrets.existingSecret or the secret values (apiKeys, llmApiKey, qdrantApiKey), not both." }}
{{- end }}
{{- end }}

{{/* Pod pieces ------------------------------------------------------------------- */}}

{{/* Variables every Engram container gets: downward API, OTel identity, secrets.
(list $ "component" "process" $values) */}}
{{- define "engram.commonEnv" -}}
{{- $root := index . 0 }}
{{- $name := index . 1 }}
{{- $process := index . 2 }}
{{- $c := index . 3 }}
- name: K8S_POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: K8S_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: K8S_NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: OTEL_SERVICE_NAME
  value: {{ printf "engram-%s" $process | quote }}
{{- $attrs := list "k8s.pod.name=$(K8S_POD_NAME)" "k8s.namespace.name=$(K8S_NAMESPACE)" "k8s.node.name=$(K8S_NODE_NAME)" (printf "k8s.container.name=%s" $process) (printf "service.version=%s" $root.Chart.AppVersion) "service.namespace=engram" (printf "engram.component=%s" $name) }}
{{- range $key, $value := $root.Values.otel.resourceAttributes }}
{{- $attrs = append $attrs (printf "%s=%v" $key $value) }}
{{- end }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ join "," $attrs | quote }}
{{- if include "engram.hasSecret" $root }}
{{- $secret := include "engram.secretName" $root }}
{{- $keys := list }}
{{- if eq $name "gateway" }}{{ $keys = list "ENGRAM_API_KEYS" "ENGRAM_LLM_API_KEY" }}{{ end }}
{{- if and (ne $name "gateway") $c.llm }}{{ $keys = list "ENGRAM_LLM_API_KEY" }}{{ end }}
{{- if eq $name "retrieval" }}{{ $keys = list "ENGRAM_QDRANT_API_KEY" }}{{ end }}
{{- range $keys }}
- name: {{ . }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ . }}
      optional: true
{{- end }}
{{- end }}
{{- range $key, $value := $c.env }}
- name: {{ $key }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- with $c.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* (list $probe-settings $handler-yaml) */}}
{{- define "engram.probe" -}}
{{- $p := index . 0 }}
{{ index . 1 }}
periodSeconds: {{ $p.periodSeconds }}
timeoutSeconds: {{ $p.timeoutSeconds }}
failureThreshold: {{ $p.failureThreshold }}
{{- with $p.initialDelaySeconds }}
initialDelaySeconds: {{ . }}
{{- end }}
{{- end }}

{{/* Probes for a container: (list $probes "http"|"grpc" port). HTTP: /healthz for
startup and liveness, /readyz for readiness (the gateway's says it can serve chats, and
does not wait for retrieval: chats are answered without memory; its /readyz/memory is
for the helm test and dashboards); gRPC: grpc.health.v1, service "". */}}
{{- define "engram.probes" -}}
{{- $probes := index . 0 }}
{{- $type := index . 1 }}
{{- $port := index . 2 }}
{{- $alive := printf "httpGet:\n  path: /healthz\n  port: %v" $port }}
{{- $ready := printf "httpGet:\n  path: /readyz\n  port: %v" $port }}
{{- if eq $type "grpc" }}
{{- $alive = printf "grpc:\n  port: %v" $port }}
{{- $ready = $alive }}
{{- end }}
{{- if $probes.startup.enabled }}
startupProbe:
  {{- include "engram.probe" (list $probes.startup $alive) | trim | nindent 2 }}
{{- end }}
{{- if $probes.liveness.enabled }}
livenessProbe:
  {{- include "engram.probe" (list $probes.liveness $alive) | trim | nindent 2 }}
{{- end }}
{{- if $probes.readiness.enabled }}
readinessProbe:
  {{- include "engram.probe" (list $probes.readiness $ready) | trim | nindent 2 }}
{{- end }}
{{- end }}

{{/* preStop drain: the kubelet's own sleep (no shell needed in the image). */}}
{{- define "engram.lifecycle" -}}
{{- if . }}
lifecycle:
  preStop:
    sleep:
      seconds: {{ . }}
{{- end }}
{{- end }}

{{/* Egress every pod needs: DNS, and the OTLP collector when traces are exported. */}}
{{- define "engram.egressDnsOtlp" -}}
{{- $np := .Values.networkPolicy }}
- ports:
    {{- range $np.dns.ports }}
    - port: {{ . }}
      protocol: UDP
    - port: {{ . }}
      protocol: TCP
    {{- end }}
  {{- with $np.dns.to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- if .Values.otel.endpoint }}
- ports:
    {{- range $np.otlp.ports }}
    - port: {{ . }}
      protocol: TCP
    {{- end }}
  {{- with $np.otlp.to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end }}
