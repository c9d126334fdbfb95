{{/*
Names, labels and the pieces every component's templates share.
*/}}

{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-sluice, or the release name when it contains "sluice"; at most 50 characters so
that <fullname>-<component>-<suffix> names stay within Kubernetes' 63. */}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sluice.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The four services, in a fixed order. */}}
{{- define "sluice.components" -}}
producer dispatcher reconciler compensator
{{- end -}}

{{/* Labels of every resource; call with (dict "root" $ "component" "dispatcher"). */}}
{{- define "sluice.labels" -}}
helm.sh/chart: {{ include "sluice.chart" .root }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/part-of: sluice
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end -}}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "sluice.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The consumer-group prefix the services derive (shared/bus, default_group_prefix):
bus.kafka.group_prefix, else the topic prefix with one trailing '.', '_' or '-' turned into
'-' ("sluice." gives "sluice-"; an empty stem gives "sluice-"). */}}
{{- define "sluice.groupPrefix" -}}
{{- $kafka := default dict (default dict .Values.config.bus).kafka -}}
{{- if $kafka.group_prefix -}}
{{- $kafka.group_prefix -}}
{{- else -}}
{{- $prefix := default "sluice." (default dict .Values.config.bus).topic_prefix -}}
{{- $stem := regexReplaceAll "[._-]$" $prefix "" -}}
{{- if $stem -}}{{ $stem }}-{{- else -}}sluice-{{- end -}}
{{- end -}}
{{- end -}}

{{/* ------------------------------------------------------------------------------------------
TOML. Helm's toToml writes every number as a float (values arrive as float64: 64 becomes
64.0), which Sluice refuses for integer keys, so the configuration is written here: a table's
plain keys first, then its sub-tables as [a.b] headers; whole numbers as integers; strings as
JSON strings (valid TOML basic strings); lists and maps inside lists inline.
*/}}
{{- define "sluice.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}{{ . }}{{- else -}}{{ toJson . }}{{- end -}}
{{- end -}}

{{- define "sluice.toml.value" -}}
{{- if kindIs "map" . -}}
{ {{- $first := true -}}
{{- range $k, $v := . -}}
{{- if not $first }}, {{ end -}}{{- $first = false -}}
{{ include "sluice.toml.key" $k }} = {{ include "sluice.toml.value" $v }}
{{- end -}} }
{{- else if kindIs "slice" . -}}
[{{- range $i, $v := . -}}{{- if $i }}, {{ end -}}{{ include "sluice.toml.value" $v }}{{- end -}}]
{{- else if or (kindIs "float64" .) (kindIs "float32" .) -}}
{{- if eq (floor .) . -}}{{ int64 . }}{{- else -}}{{ . }}{{- end -}}
{{- else if or (kindIs "int" .) (kindIs "int64" .) (kindIs "bool" .) -}}
{{ . }}
{{- else if kindIs "string" . -}}
{{ toJson . }}
{{- else -}}
{{ fail (printf "config: a value of type %s cannot be written as TOML" (kindOf .)) }}
{{- end -}}
{{- end -}}

{{/* Call with (dict "table" $map "path" "a.b"). */}}
{{- define "sluice.toml.table" -}}
{{- $path := .path -}}
{{- range $k, $v := .table }}
{{- if and (not (kindIs "map" $v)) (not (kindIs "invalid" $v)) }}
{{ include "sluice.toml.key" $k }} = {{ include "sluice.toml.value" $v }}
{{- end }}
{{- end }}
{{- range $k, $v := .table }}
{{- if kindIs "map" $v }}
{{- $sub := ternary (include "sluice.toml.key" $k) (printf "%s.%s" $path (include "sluice.toml.key" $k)) (eq $path "") }}

[{{ $sub }}]
{{- include "sluice.toml.table" (dict "table" $v "path" $sub) }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The configuration file as mounted: `config` written as TOML. */}}
{{- define "sluice.configToml" -}}
# sluice.toml, rendered by the Sluice Helm chart from its `config` value (docs/deploy.md).
# Secrets and per-pod settings are SLUICE_ environment overrides in the pods, never here.
{{- include "sluice.toml.table" (dict "table" .Values.config "path" "") }}
{{ end -}}

{{- define "sluice.catalogToml" -}}
{{- if .Values.catalog -}}
{{ .Values.catalog }}
{{- else -}}
{{ .Files.Get "files/catalog.example.toml" }}
{{- end -}}
{{- end -}}

{{/* The ConfigMap's data, shared by the services' ConfigMap and the migration hook's copy. */}}
{{- define "sluice.configData" -}}
sluice.toml: |
{{ include "sluice.configToml" . | indent 2 }}
{{- if not .Values.catalogConfigMap.name }}
catalog.toml: |
{{ include "sluice.catalogToml" . | indent 2 }}
{{- end }}
{{- end -}}

{{/* ------------------------------------------------------------------------------------------
Checks of the values that the schema cannot express, failing the render with the key named.
*/}}
{{- define "sluice.validate" -}}
{{- $bus := default dict .Values.config.bus -}}
{{- $kafka := default dict $bus.kafka -}}
{{- $partitions := int (default 64 $bus.partitions) -}}
{{- range $c := list "dispatcher" "reconciler" "compensator" -}}
{{- $a := (index $.Values $c).autoscaling -}}
{{- if and $a.enabled (gt (int $a.maxReplicas) $partitions) -}}
{{- fail (printf "%s.autoscaling.maxReplicas (%d) must be at most config.bus.partitions (%d): Kafka gives each partition to one consumer of a group, so more replicas sit idle" $c (int $a.maxReplicas) $partitions) -}}
{{- end -}}
{{- if and $a.enabled (gt (int $a.minReplicas) (int $a.maxReplicas)) -}}
{{- fail (printf "%s.autoscaling.minReplicas (%d) is above its maxReplicas (%d)" $c (int $a.minReplicas) (int $a.maxReplicas)) -}}
{{- end -}}
{{- end -}}
{{- $e := .Values.engines.kafka -}}
{{- if and (or $e.sasl.usernameKey $e.sasl.passwordKey) (not (default dict $kafka.sasl).mechanism) -}}
{{- fail "engines.kafka.sasl: set config.bus.kafka.sasl.mechanism (plain, scram_sha_256 or scram_sha_512) and config.bus.kafka.security_protocol (sasl_ssl) to use the SASL credentials" -}}
{{- end -}}
{{- if and (or $e.oauthbearer.clientIdKey $e.oauthbearer.clientSecretKey) (not (default dict $kafka.oauthbearer).token_endpoint_url) -}}
{{- fail "engines.kafka.oauthbearer: set config.bus.kafka.oauthbearer.token_endpoint_url (and security_protocol sasl_ssl) to use the OAUTHBEARER client credentials" -}}
{{- end -}}
{{- if and (or $e.sasl.usernameKey $e.sasl.passwordKey) (or $e.oauthbearer.clientIdKey $e.oauthbearer.clientSecretKey) -}}
{{- fail "engines.kafka: sasl and oauthbearer exclude each other (docs/security.md): set the keys of one" -}}
{{- end -}}
{{- $anyEngineKey := or $e.brokersKey $e.sasl.usernameKey $e.sasl.passwordKey $e.oauthbearer.clientIdKey $e.oauthbearer.clientSecretKey $e.caKey .Values.engines.cql.nodesKey .Values.engines.cql.usernameKey .Values.engines.cql.passwordKey .Values.engines.cql.caKey -}}
{{- if and $anyEngineKey (not (include "sluice.enginesSecret" .)) -}}
{{- fail "engines: keys of a Secret are named but no Secret: set engines.existingSecret (or existingSecret)" -}}
{{- end -}}
{{- if and .Values.externalSecret.enabled (not .Values.existingSecret) -}}
{{- fail "externalSecret.enabled: set existingSecret to the name of the Secret the ExternalSecret creates" -}}
{{- end -}}
{{- if and .Values.externalSecret.enabled (not .Values.externalSecret.secretStoreRef.name) -}}
{{- fail "externalSecret.secretStoreRef.name: name the SecretStore or ClusterSecretStore to read from" -}}
{{- end -}}
{{- if and .Values.producer.tls.enabled (not .Values.producer.tls.secretName) -}}
{{- fail "producer.tls.secretName: name the kubernetes.io/tls Secret holding the API's certificate" -}}
{{- end -}}
{{- if and .Values.catalog .Values.catalogConfigMap.name -}}
{{- fail "catalog and catalogConfigMap.name: give the catalog one way, not both" -}}
{{- end -}}
{{- end -}}

{{- define "sluice.enginesSecret" -}}
{{- default .Values.existingSecret .Values.engines.existingSecret -}}
{{- end -}}

{{/* ------------------------------------------------------------------------------------------
The pod spec of a Sluice process: (dict "root" $ "component" "dispatcher" "hook" false).
The migration Job uses it with component "migrate".
*/}}
{{- define "sluice.env" -}}
{{- $root := .root -}}
{{- $c := .component -}}
{{- $secret := include "sluice.enginesSecret" $root -}}
{{- $e := $root.Values.engines -}}
- name: SLUICE_CONFIG
  value: /etc/sluice/sluice.toml
{{- if $root.Values.catalogConfigMap.name }}
- name: SLUICE_CATALOG__PATH
  value: /etc/sluice-catalog/{{ $root.Values.catalogConfigMap.key }}
{{- end }}
{{- range $pair := list (list $e.kafka.brokersKey "SLUICE_BUS__KAFKA__BROKERS") (list $e.kafka.sasl.usernameKey "SLUICE_BUS__KAFKA__SASL__USERNAME") (list $e.kafka.sasl.passwordKey "SLUICE_BUS__KAFKA__SASL__PASSWORD") (list $e.kafka.oauthbearer.clientIdKey "SLUICE_BUS__KAFKA__OAUTHBEARER__CLIENT_ID") (list $e.kafka.oauthbearer.clientSecretKey "SLUICE_BUS__KAFKA__OAUTHBEARER__CLIENT_SECRET") (list $e.cql.nodesKey "SLUICE_LEDGER__CQL__NODES") (list $e.cql.usernameKey "SLUICE_LEDGER__CQL__USERNAME") (list $e.cql.passwordKey "SLUICE_LEDGER__CQL__PASSWORD") }}
{{- if index $pair 0 }}
- name: {{ index $pair 1 }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ index $pair 0 }}
{{- end }}
{{- end }}
{{- if $e.kafka.caKey }}
- name: SLUICE_BUS__KAFKA__TLS__CA_FILE
  value: /etc/sluice-engines/kafka-ca.pem
{{- end }}
{{- if $e.cql.caKey }}
- name: SLUICE_LEDGER__CQL__TLS__CA_FILE
  value: /etc/sluice-engines/cql-ca.pem
{{- end }}
{{- if eq $c "producer" }}
- name: SLUICE_PRODUCER__LISTEN
  value: "0.0.0.0:{{ $root.Values.producer.service.port }}"
{{- $svc := printf "%s-producer" (include "sluice.fullname" $root) }}
{{- $ns := $root.Release.Namespace }}
{{- $hosts := concat (list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns)) $root.Values.producer.extraAllowedHosts }}
# The names the API answers to besides localhost and IP addresses (probes and Prometheus use
# the pod's IP): its Service's, and producer.extraAllowedHosts. Any other Host gets 421.
- name: SLUICE_PRODUCER__ALLOWED_HOSTS
  value: {{ include "sluice.toml.value" $hosts | quote }}
{{- if $root.Values.producer.tls.enabled }}
- name: SLUICE_PRODUCER__TLS__CERT_FILE
  value: /etc/sluice-api-tls/tls.crt
- name: SLUICE_PRODUCER__TLS__KEY_FILE
  value: /etc/sluice-api-tls/tls.key
{{- end }}
{{- else if ne $c "migrate" }}
# /metrics, /healthz and /readyz.
- name: SLUICE_TELEMETRY__LISTEN
  value: 0.0.0.0:9464
{{- end }}
{{- if eq $c "reconciler" }}
# The one service that reports the state gauges ([metrics] command_gauges).
- name: SLUICE_METRICS__COMMAND_GAUGES
  value: "true"
{{- end }}
{{- if and $root.Values.staticMembership (has $c (list "dispatcher" "reconciler" "compensator")) }}
# Static group membership: group.instance.id from the pod's name.
- name: SLUICE_BUS__KAFKA__INSTANCE_ID
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end }}
{{- with (ternary $root.Values.migration.extraEnv (index $root.Values $c | default dict).extraEnv (eq $c "migrate")) }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "sluice.volumeMounts" -}}
- name: config
  mountPath: /etc/sluice
  readOnly: true
{{- if .root.Values.catalogConfigMap.name }}
- name: catalog
  mountPath: /etc/sluice-catalog
  readOnly: true
{{- end }}
- name: tmp
  mountPath: /tmp
{{- if .root.Values.tlsSecret }}
# CA files and client certificates for Kafka and CQL (docs/security.md).
- name: tls
  mountPath: /etc/sluice-tls
  readOnly: true
{{- end }}
{{- if or .root.Values.engines.kafka.caKey .root.Values.engines.cql.caKey }}
- name: engines-ca
  mountPath: /etc/sluice-engines
  readOnly: true
{{- end }}
{{- if and (eq .component "producer") .root.Values.producer.tls.enabled }}
# The API's certificate and key ([producer.tls]); reloaded when renewed.
- name: api-tls
  mountPath: /etc/sluice-api-tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "sluice.volumes" -}}
{{- $root := .root -}}
- name: config
  configMap:
    name: {{ .configMap }}
{{- if $root.Values.catalogConfigMap.name }}
- name: catalog
  configMap:
    name: {{ $root.Values.catalogConfigMap.name }}
{{- end }}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if $root.Values.tlsSecret }}
- name: tls
  secret:
    secretName: {{ $root.Values.tlsSecret }}
    # Readable by the non-root user (the pod sets no fsGroup).
    defaultMode: 0444
{{- end }}
{{- if or $root.Values.engines.kafka.caKey $root.Values.engines.cql.caKey }}
- name: engines-ca
  secret:
    secretName: {{ include "sluice.enginesSecret" $root }}
    defaultMode: 0444
    items:
    {{- with $root.Values.engines.kafka.caKey }}
      - key: {{ . }}
        path: kafka-ca.pem
    {{- end }}
    {{- with $root.Values.engines.cql.caKey }}
      - key: {{ . }}
        path: cql-ca.pem
    {{- end }}
{{- end }}
{{- if and (eq .component "producer") $root.Values.producer.tls.enabled }}
- name: api-tls
  secret:
    secretName: {{ $root.Values.producer.tls.secretName }}
    defaultMode: 0444
{{- end }}
{{- end -}}

{{- define "sluice.envFrom" -}}
{{- if .Values.existingSecret -}}
envFrom:
  - secretRef:
      name: {{ .Values.existingSecret }}
{{- end }}
{{- end -}}
