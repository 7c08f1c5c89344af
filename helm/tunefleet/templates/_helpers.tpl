{{/* Names. */}}
{{- define "tunefleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tunefleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tunefleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tunefleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tunefleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tunefleet.labels" -}}
helm.sh/chart: {{ include "tunefleet.chart" . }}
{{ include "tunefleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tunefleet
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "tunefleet.serverName" -}}
{{- printf "%s-prefect-server" (include "tunefleet.fullname" .) }}
{{- end }}
{{- define "tunefleet.configName" -}}
{{- printf "%s-config" (include "tunefleet.fullname" .) }}
{{- end }}
{{- define "tunefleet.poolsName" -}}
{{- printf "%s-pools" (include "tunefleet.fullname" .) }}
{{- end }}
{{- define "tunefleet.workerServiceAccount" -}}
{{- printf "%s-worker" (include "tunefleet.fullname" .) }}
{{- end }}
{{- define "tunefleet.runServiceAccount" -}}
{{- printf "%s-run" (include "tunefleet.fullname" .) }}
{{- end }}
{{- define "tunefleet.registryName" -}}
{{- printf "%s-registry" (include "tunefleet.fullname" .) }}
{{- end }}

{{/* The Secret every pod reads credentials from (after the install hooks). */}}
{{- define "tunefleet.secretName" -}}
{{- default (include "tunefleet.fullname" .) .Values.secrets.existingSecret }}
{{- end }}

{{/* The Secret the pre-install/pre-upgrade migration hook reads: the chart's own Secret is not
     there yet before install, so the hook gets a short-lived copy of the database URL. */}}
{{- define "tunefleet.migrateSecretName" -}}
{{- if .Values.secrets.existingSecret }}
{{- .Values.secrets.existingSecret }}
{{- else }}
{{- printf "%s-migrate" (include "tunefleet.fullname" .) }}
{{- end }}
{{- end }}

{{- define "tunefleet.externalPrefect" -}}
{{- if .Values.prefect.apiUrl }}true{{ end }}
{{- end }}

{{/* "true" when Prefect clients send an auth string: always to the server the chart runs; to an
     external API when one is given (or may be in secrets.existingSecret). */}}
{{- define "tunefleet.prefectAuth" -}}
{{- if or (not (include "tunefleet.externalPrefect" .)) .Values.secrets.prefectAuthString .Values.secrets.existingSecret }}true{{ end }}
{{- end }}

{{/* The Prefect API's auth string for the Secret the chart creates: the value given, else the one
     the release's Secret already holds (kept across upgrades), else a new one. */}}
{{- define "tunefleet.prefectAuthString" -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "tunefleet.secretName" .) }}
{{- $key := .Values.secrets.keys.prefectAuthString }}
{{- if .Values.secrets.prefectAuthString }}
{{- .Values.secrets.prefectAuthString }}
{{- else if and $existing (hasKey ($existing.data | default dict) $key) }}
{{- index $existing.data $key | b64dec }}
{{- else }}
{{- printf "tunefleet:%s" (randAlphaNum 32) }}
{{- end }}
{{- end }}

{{/* PREFECT_API_AUTH_STRING from the Secret for a Prefect client; optional for an external API. */}}
{{- define "tunefleet.prefectAuthEnv" -}}
{{- if include "tunefleet.prefectAuth" . }}
- name: PREFECT_API_AUTH_STRING
  valueFrom:
    secretKeyRef:
      name: {{ include "tunefleet.secretName" . }}
      key: {{ .Values.secrets.keys.prefectAuthString }}
      {{- if include "tunefleet.externalPrefect" . }}
      optional: true
      {{- end }}
{{- end }}
{{- end }}

{{/* TLS trust: where the database's and the store's CA bundles are mounted. */}}
{{- define "tunefleet.systemCaBundle" -}}/etc/ssl/certs/ca-certificates.crt{{- end }}
{{- define "tunefleet.databaseCaDir" -}}/etc/tunefleet/tls/database{{- end }}
{{- define "tunefleet.s3CaDir" -}}/etc/tunefleet/tls/s3{{- end }}

{{/* PGSSLROOTCERT: the file libpq and asyncpg verify the database server's certificate with;
     "" when the mode verifies nothing and no CA was given (require would turn into verify-ca). */}}
{{- define "tunefleet.databaseCaFile" -}}
{{- $ca := .Values.database.caCert }}
{{- if or $ca.configMap $ca.secret }}
{{- printf "%s/%s" (include "tunefleet.databaseCaDir" .) $ca.key }}
{{- else if has .Values.database.sslmode (list "verify-ca" "verify-full") }}
{{- include "tunefleet.systemCaBundle" . }}
{{- end }}
{{- end }}

{{- define "tunefleet.s3CaFile" -}}
{{- $ca := .Values.s3.caCert }}
{{- if or $ca.configMap $ca.secret }}{{ printf "%s/%s" (include "tunefleet.s3CaDir" .) $ca.key }}{{ end }}
{{- end }}

{{/* Volumes and mounts of the CA bundles given as ConfigMaps or Secrets (database, then S3).
     Argument: dict "root" $ "database" bool "s3" bool (which ones this pod needs). */}}
{{- define "tunefleet.caVolumes" -}}
{{- $v := .root.Values }}
{{- range $name, $ca := dict "database-ca" (and .database $v.database.caCert) "s3-ca" (and .s3 $v.s3.caCert) }}
{{- if and $ca (or $ca.configMap $ca.secret) }}
- name: {{ $name }}
  {{- if $ca.configMap }}
  configMap:
    name: {{ $ca.configMap }}
    items: [{key: {{ $ca.key }}, path: {{ $ca.key }}}]
  {{- else }}
  secret:
    secretName: {{ $ca.secret }}
    items: [{key: {{ $ca.key }}, path: {{ $ca.key }}}]
  {{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tunefleet.caMounts" -}}
{{- $v := .root.Values }}
{{- range $name, $ca := dict "database-ca" (and .database $v.database.caCert) "s3-ca" (and .s3 $v.s3.caCert) }}
{{- if and $ca (or $ca.configMap $ca.secret) }}
- name: {{ $name }}
  mountPath: {{ if eq $name "database-ca" }}{{ include "tunefleet.databaseCaDir" $.root }}{{ else }}{{ include "tunefleet.s3CaDir" $.root }}{{ end }}
  readOnly: true
{{- end }}
{{- end }}
{{- end }}

{{- define "tunefleet.prefectApiUrl" -}}
{{- if .Values.prefect.apiUrl }}
{{- .Values.prefect.apiUrl }}
{{- else }}
{{- printf "http://%s.%s.svc:%d/api" (include "tunefleet.serverName" .) .Release.Namespace (int .Values.prefect.server.port) }}
{{- end }}
{{- end }}

{{- define "tunefleet.image" -}}
{{- printf "%s:%s" .Values.image.repository (toString .Values.image.tag) }}
{{- end }}

{{/* A user name or password percent-encoded for a URL's user-info, as SQLAlchemy's make_url (which
     tunefleet and Prefect read the URLs with) decodes it: urlquery encodes everything but letters,
     digits and "-_.~", a literal "+" as %2B and a space as "+", which make_url would read back as a
     literal "+"; so every "+" left is a space and becomes %20. */}}
{{- define "tunefleet.urlUserInfo" -}}
{{- urlquery . | replace "+" "%20" }}
{{- end }}

{{/* The database URLs, composed for the Secret the chart creates. */}}
{{- define "tunefleet.databaseUrl" -}}
{{- $db := .Values.database }}
{{- $user := include "tunefleet.urlUserInfo" $db.user }}
{{- $password := include "tunefleet.urlUserInfo" .Values.secrets.databasePassword }}
{{- $url := printf "postgresql+psycopg2://%s:%s@%s:%d/%s" $user $password $db.host (int $db.port) $db.name }}
{{- if $db.sslmode }}{{ $url = printf "%s?sslmode=%s" $url $db.sslmode }}{{ end }}
{{- $url }}
{{- end }}

{{- define "tunefleet.prefectDatabaseUrl" -}}
{{- $db := .Values.database }}
{{- $user := include "tunefleet.urlUserInfo" $db.user }}
{{- $password := include "tunefleet.urlUserInfo" .Values.secrets.databasePassword }}
{{- $url := printf "postgresql+asyncpg://%s:%s@%s:%d/%s" $user $password $db.host (int $db.port) .Values.prefect.server.database.name }}
{{- if has $db.sslmode (list "require" "verify-ca" "verify-full") }}{{ $url = printf "%s?ssl=%s" $url $db.sslmode }}{{ end }}
{{- $url }}
{{- end }}

{{/* The enabled hardware classes, as a JSON list of names (sorted). */}}
{{- define "tunefleet.enabledClasses" -}}
{{- $out := list }}
{{- range $name, $hw := .Values.hardware }}
{{- if $hw.enabled }}{{ $out = append $out $name }}{{ end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* TUNEFLEET_HARDWARE: node-pool overrides and per-class settings; "" when nothing differs
     from the built-in classes (setting it makes every command re-seed the classes). A class's
     built-in node pool is its name, but x86-avx2's is x86 (tunefleet.hardware.BUILTIN_FIGURES). */}}
{{- define "tunefleet.hardwareSetting" -}}
{{- $out := dict }}
{{- $builtinPools := dict "x86-avx2" "x86" }}
{{- range $name, $hw := .Values.hardware }}
{{- if $hw.enabled }}
{{- $entry := deepCopy (default (dict) $hw.settings) }}
{{- if ne $hw.nodePool (get $builtinPools $name | default $name) }}{{ $_ := set $entry "node_pool" $hw.nodePool }}{{ end }}
{{- if $entry }}{{ $_ := set $out $name $entry }}{{ end }}
{{- end }}
{{- end }}
{{- if $out }}{{ toJson $out }}{{ end }}
{{- end }}

{{/* Non-secret configuration (the ConfigMap's data; the migration hook gets it inline). */}}
{{- define "tunefleet.configData" -}}
HOME: /home/tunefleet
TUNEFLEET_HOME: /home/tunefleet/.tunefleet
PREFECT_HOME: /home/tunefleet/.prefect
PYTHONDONTWRITEBYTECODE: "1"
PREFECT_SERVER_ANALYTICS_ENABLED: "false"
PREFECT_LOGGING_EXTRA_LOGGERS: tunefleet
PREFECT_API_URL: {{ include "tunefleet.prefectApiUrl" . | quote }}
TUNEFLEET_LOG_LEVEL: {{ .Values.logLevel | quote }}
TUNEFLEET_DB_CONNECT_TIMEOUT_S: {{ .Values.database.connectTimeoutSeconds | toString | quote }}
TUNEFLEET_DB_STATEMENT_TIMEOUT_S: {{ .Values.database.statementTimeoutSeconds | toString | quote }}
TUNEFLEET_STORE: s3
TUNEFLEET_S3_ENDPOINT: {{ .Values.s3.endpoint | quote }}
TUNEFLEET_S3_BUCKET: {{ .Values.s3.bucket | quote }}
TUNEFLEET_S3_PREFIX: {{ .Values.s3.prefix | quote }}
TUNEFLEET_S3_SECURE: {{ .Values.s3.secure | toString | quote }}
{{- with .Values.s3.region }}
TUNEFLEET_S3_REGION: {{ . | quote }}
{{- end }}
{{- with (include "tunefleet.databaseCaFile" .) }}
PGSSLROOTCERT: {{ . | quote }}
{{- end }}
{{- with (include "tunefleet.s3CaFile" .) }}
SSL_CERT_FILE: {{ . | quote }}
{{- end }}
TUNEFLEET_METRICS_PUSHGATEWAY: {{ .Values.metrics.pushgateway | quote }}
{{- with (include "tunefleet.hardwareSetting" .) }}
TUNEFLEET_HARDWARE: {{ . | quote }}
{{- end }}
{{- range $k, $v := .Values.extraEnv }}
{{ $k }}: {{ $v | toString | quote }}
{{- end }}
{{- end }}

{{/* tunefleet's own credentials, the database URL and the S3 keys, as secretKeyRef env entries
     to the release's Secret: the schedule registry gets these alone (it is no Prefect client). */}}
{{- define "tunefleet.storeSecretEnv" -}}
{{- $secret := include "tunefleet.secretName" . -}}
- name: TUNEFLEET_DATABASE_URL
  valueFrom:
    secretKeyRef: {name: {{ $secret }}, key: {{ .Values.secrets.keys.databaseUrl }}}
- name: TUNEFLEET_S3_ACCESS_KEY
  valueFrom:
    secretKeyRef: {name: {{ $secret }}, key: {{ .Values.secrets.keys.s3AccessKey }}}
- name: TUNEFLEET_S3_SECRET_KEY
  valueFrom:
    secretKeyRef: {name: {{ $secret }}, key: {{ .Values.secrets.keys.s3SecretKey }}}
{{- end }}

{{/* tunefleet's credentials as secretKeyRef env entries (the deploy hook and, through the pools'
     templates, every flow-run Job), with the Prefect API's auth string; a flow run's
     PREFECT_API_KEY is the worker's business. */}}
{{- define "tunefleet.secretEnv" -}}
{{ include "tunefleet.storeSecretEnv" . }}
{{- include "tunefleet.prefectAuthEnv" . }}
{{- end }}

{{/* PREFECT_API_KEY for clients of an external Prefect API, when one is configured. */}}
{{- define "tunefleet.prefectApiKeyEnv" -}}
{{- if and (include "tunefleet.externalPrefect" .) (or .Values.secrets.existingSecret .Values.secrets.prefectApiKey) }}
- name: PREFECT_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "tunefleet.secretName" . }}
      key: {{ .Values.secrets.keys.prefectApiKey }}
      optional: true
{{- end }}
{{- end }}

{{- define "tunefleet.podSecurityContext" -}}
{{ toYaml .Values.podSecurityContext }}
{{- end }}
{{- define "tunefleet.containerSecurityContext" -}}
{{ toYaml .Values.containerSecurityContext }}
{{- end }}

{{- define "tunefleet.scratchVolumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.scratch.tmpSizeLimit }}
- name: home
  emptyDir:
    sizeLimit: {{ .Values.scratch.homeSizeLimit }}
{{- end }}

{{- define "tunefleet.scratchMounts" -}}
- name: tmp
  mountPath: /tmp
- name: home
  mountPath: /home/tunefleet
{{- end }}

{{- define "tunefleet.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* Tolerations of a hardware class: its node-pool taint, the GPU taint with GPUs, extras. */}}
{{- define "tunefleet.classTolerations" -}}
{{- $hw := .hw -}}
- key: tunefleet.io/hardware
  operator: Equal
  value: {{ $hw.nodePool | quote }}
  effect: NoSchedule
{{- if gt (int $hw.gpus) 0 }}
- key: nvidia.com/gpu
  operator: Exists
  effect: NoSchedule
{{- end }}
{{- with $hw.tolerations }}
{{ toYaml . }}
{{- end }}
{{- end }}
