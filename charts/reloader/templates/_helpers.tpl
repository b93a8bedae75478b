{{/* Names and labels as Reloader's chart makes them, so that an upgrade keeps every object. */}}

{{- define "reloader-name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" | lower -}}
{{- end -}}

{{- define "reloader-fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (default .Chart.Name .Values.nameOverride) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "reloader-labels.chart" -}}
app: {{ include "reloader-fullname" . }}
release: {{ .Release.Name | quote }}
app.kubernetes.io/name: {{ include "reloader-name" . }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
helm.sh/chart: "{{ .Chart.Name }}-{{ .Chart.Version | replace "+" "_" }}"
chart: "{{ .Chart.Name }}-{{ .Chart.Version | replace "+" "_" }}"
heritage: {{ .Release.Service | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- define "reloader-match-labels" -}}
app: {{ include "reloader-fullname" . }}
release: {{ .Release.Name | quote }}
{{- with .Values.reloader.matchLabels }}
{{ tpl (toYaml .) $ }}
{{- end }}
{{- end -}}

{{- define "reloader-namespace" -}}
{{- .Values.namespace | default .Release.Namespace -}}
{{- end -}}

{{- define "reloader-serviceAccountName" -}}
{{- if .Values.reloader.serviceAccount.create -}}
{{- default (include "reloader-fullname" .) .Values.reloader.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.reloader.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "reloader-helm3.annotations" -}}
meta.helm.sh/release-namespace: {{ .Release.Namespace | quote }}
meta.helm.sh/release-name: {{ .Release.Name | quote }}
{{- end -}}

{{- define "reloader-image" -}}
{{- $repository := .Values.image.repository | default .Values.image.name -}}
{{- if .Values.global.imageRegistry -}}
{{- $repository = printf "%s/%s" .Values.global.imageRegistry $repository -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion | toString) -}}
{{- end -}}
{{- end -}}

{{/* The namespaces of scoped mode, comma-separated, sorted, once each: the listed ones (a list or
a comma-separated string) plus, with v1 semantics, the release's; with v2 semantics and no list,
the release's alone (v2's single-namespace mode). */}}
{{- define "reloader-scoped-namespaces" -}}
{{- $listed := .Values.reloader.namespaces | default list -}}
{{- if kindIs "string" $listed }}{{ $listed = splitList "," $listed }}{{ end -}}
{{- $all := list -}}
{{- range $listed }}{{ with . | toString | trim }}{{ $all = append $all . }}{{ end }}{{ end -}}
{{- if or (eq (include "reloader-semantics" .) "v1") (not $all) }}{{ $all = append $all (include "reloader-namespace" .) }}{{ end -}}
{{- $all | uniq | sortAlpha | join "," -}}
{{- end -}}

{{- define "reloader-podAntiAffinity" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
  - weight: 100
    podAffinityTerm:
      labelSelector:
        matchExpressions:
        - key: app.kubernetes.io/instance
          operator: In
          values:
          - {{ .Release.Name | quote }}
      topologyKey: "kubernetes.io/hostname"
{{- end -}}

{{/*
The rules the controller needs in every namespace it watches: read ConfigMaps and Secrets (unless
ignored), keep a store of the workloads (watch) and write them, create Jobs for CronJobs, post
Events. Namespaces are added for the ClusterRole only.
*/}}
{{- define "reloader-rules" -}}
{{- $v := .Values.reloader -}}
{{- if not (and $v.ignoreSecrets $v.ignoreConfigMaps) }}
- apiGroups: [""]
  resources:
  {{- if not $v.ignoreSecrets }}
  - secrets
  {{- end }}
  {{- if not $v.ignoreConfigMaps }}
  - configmaps
  {{- end }}
  verbs: [list, get, watch]
{{- end }}
{{- if $v.isOpenshift }}
- apiGroups: [apps.openshift.io]
  resources: [deploymentconfigs]
  verbs: [list, get, watch, patch]
{{- end }}
{{- if $v.isArgoRollouts }}
- apiGroups: [argoproj.io]
  resources: [rollouts]
  verbs: [list, get, watch, patch]
{{- end }}
- apiGroups: [apps]
  resources: [deployments, daemonsets, statefulsets]
  verbs: [list, get, watch, patch]
{{- if not $v.ignoreCronJobs }}
- apiGroups: [batch]
  resources: [cronjobs]
  verbs: [list, get, watch, patch]
{{- end }}
{{- if not $v.ignoreJobs }}
- apiGroups: [batch]
  resources: [jobs]
  verbs: [create, delete, list, get, watch]
{{- end }}
{{- if $v.enableCSIIntegration }}
- apiGroups: [secrets-store.csi.x-k8s.io]
  resources: [secretproviderclasspodstatuses, secretproviderclasses]
  verbs: [list, get, watch]
{{- end }}
{{- range $v.customKinds }}
- apiGroups: [{{ splitList "/" .apiVersion | first | quote }}]
  resources: [{{ .plural | quote }}]
  verbs: [list, get, watch, patch]
{{- end }}
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}

{{/* The --custom-kinds-file the controller reads: reloader.customKinds as a `kinds:` list. */}}
{{- define "reloader-custom-kinds" -}}
{{ toYaml (dict "kinds" .Values.reloader.customKinds) }}
{{- end -}}

{{/* The ConfigMaps the controller writes in its namespace, as a YAML list (the RBAC names each):
Reloader's reloader-meta-info and the checkpoints, one per shard. */}}
{{- define "reloader-own-configmaps" -}}
{{- $shards := int .Values.reloader.sharding.shards }}
- reloader-meta-info
{{- if le $shards 1 }}
- reloader-fleet-checkpoint
{{- else }}
{{- range $shard := until $shards }}
- reloader-fleet-checkpoint-shard-{{ $shard }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The parts a checkpoint is split into once it outgrows one ConfigMap (at most 32 a shard:
-part-0 to -part-31), as a YAML list: the RBAC names each. */}}
{{- define "reloader-checkpoint-parts" -}}
{{- $shards := int .Values.reloader.sharding.shards }}
{{- range $shard := until (max 1 $shards | int) }}
{{- $head := ternary "reloader-fleet-checkpoint" (printf "reloader-fleet-checkpoint-shard-%d" $shard) (le $shards 1) }}
{{- range $part := until 32 }}
- {{ $head }}-part-{{ $part }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The container's environment, as Reloader's chart renders it for the same values (GOMAXPROCS
and GOMEMLIMIT too: harmless to this binary, and an image swap then changes no env). */}}
{{- define "reloader-env" -}}
{{- $v := .Values.reloader -}}
{{- $d := $v.deployment -}}
{{- $env := $d.env | default dict -}}
- name: GOMAXPROCS
{{- if $d.gomaxprocsOverride }}
  value: {{ $d.gomaxprocsOverride | quote }}
{{- else }}
  valueFrom:
    resourceFieldRef:
      resource: limits.cpu
      divisor: '1'
{{- end }}
- name: GOMEMLIMIT
{{- if $d.gomemlimitOverride }}
  value: {{ $d.gomemlimitOverride | quote }}
{{- else }}
  valueFrom:
    resourceFieldRef:
      resource: limits.memory
      divisor: '1'
{{- end }}
{{- range $name, $value := $env.open }}
{{- if not (empty $value) }}
- name: {{ $name | quote }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}
{{- $secretName := include "reloader-fullname" . }}
{{- range $name, $value := $env.secret }}
{{- if not (empty $value) }}
- name: {{ $name | quote }}
  valueFrom:
    secretKeyRef:
      name: {{ $secretName }}
      key: {{ $name | quote }}
{{- end }}
{{- end }}
{{- range $secret, $entries := $env.existing }}
{{- range $name, $key := $entries }}
{{- if not (empty $name) }}
- name: {{ $name | quote }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret | quote }}
      key: {{ $key | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- range $name, $path := $env.field }}
{{- if not (empty $path) }}
- name: {{ $name | quote }}
  valueFrom:
    fieldRef:
      fieldPath: {{ $path | quote }}
{{- end }}
{{- end }}
{{- /* v2 passes the release namespace as --namespaces instead. */}}
{{- if and (not $v.watchGlobally) (not $v.namespaces) (ne (include "reloader-semantics" .) "v2") }}
- name: KUBERNETES_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end }}
{{- /* Where and as what Reloader publishes its reloader-meta-info ConfigMap. */}}
- name: RELOADER_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: RELOADER_DEPLOYMENT_NAME
  value: {{ include "reloader-fullname" . }}
{{- if $v.enableHA }}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end }}
{{- if $v.enableMetricsByNamespace }}
- name: METRICS_COUNT_BY_NAMESPACE
  value: enabled
{{- end }}
{{- end -}}

{{/* Which Reloader chart this one renders like where the two differ: "v1" (chart 2.2.16, the
default) or "v2" (chart reloader-v2 2.0.0). */}}
{{- define "reloader-semantics" -}}
{{- $s := .Values.reloader.compatibleWith | default "v1" | toString -}}
{{- if not (has $s (list "v1" "v2")) }}{{ fail (printf "reloader.compatibleWith is %q: it must be v1 or v2" $s) }}{{ end -}}
{{- $s -}}
{{- end -}}

{{/*
The image pull secrets: global.imagePullSecrets, then reloader.deployment.imagePullSecrets, each
entry a name or a {name: ...} map as in Reloader's chart, every secret once.
*/}}
{{- define "reloader-imagePullSecrets" -}}
{{- $names := list }}
{{- range $s := concat (.Values.global.imagePullSecrets | default list) (.Values.reloader.deployment.imagePullSecrets | default list) }}
{{- $name := $s }}{{ if kindIs "map" $s }}{{ $name = get $s "name" }}{{ end }}
{{- if and $name (not (has $name $names)) }}{{ $names = append $names $name }}{{ end }}
{{- end }}
{{- range $names }}
- name: {{ . }}
{{- end }}
{{- end -}}

{{/*
Switches Reloader's chart compares with `eq ... true` refuse a string there (Go's templates
cannot compare a string with a boolean); so do this chart's own switches. Say what to write.
*/}}
{{- define "reloader-strict-switches" -}}
{{- $v := .Values.reloader }}
{{- $switches := dict "reloader.autoReloadAll" $v.autoReloadAll "reloader.isArgoRollouts" $v.isArgoRollouts "reloader.reloadOnCreate" $v.reloadOnCreate "reloader.reloadOnDelete" $v.reloadOnDelete "reloader.syncAfterRestart" $v.syncAfterRestart "reloader.watchGlobally" $v.watchGlobally "reloader.readOnlyRootFileSystem" $v.readOnlyRootFileSystem "reloader.annotationLint" $v.annotationLint "reloader.removeOrphanedEnvVars" $v.removeOrphanedEnvVars "reloader.removeOrphanedEnvVarsAtOnce" $v.removeOrphanedEnvVarsAtOnce "reloader.reloadOnUsedKeys" $v.reloadOnUsedKeys "reloader.http2" $v.http2 "reloader.sharding.hotStandby" $v.sharding.hotStandby "grafanaDashboard.enabled" .Values.grafanaDashboard.enabled }}
{{- range $path := keys $switches | sortAlpha }}
{{- $value := get $switches $path }}
{{- if kindIs "string" $value }}
{{- fail (printf "%s is the string %q; write true or false without quotes (Reloader's chart refuses a string here too)" $path $value) }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
Switches Reloader's chart reads with a plain `if` take a string as it does: any non-empty string,
"false" too, is on. Listed in NOTES.txt, since that is rarely what was meant.
*/}}
{{- define "reloader-string-switches" -}}
{{- $v := .Values.reloader }}
{{- $switches := dict "reloader.isOpenshift" $v.isOpenshift "reloader.ignoreSecrets" $v.ignoreSecrets "reloader.ignoreConfigMaps" $v.ignoreConfigMaps "reloader.ignoreJobs" $v.ignoreJobs "reloader.ignoreCronJobs" $v.ignoreCronJobs "reloader.enableHA" $v.enableHA "reloader.enablePProf" $v.enablePProf "reloader.enableCSIIntegration" $v.enableCSIIntegration "reloader.enableMetricsByNamespace" $v.enableMetricsByNamespace "reloader.rbac.enabled" $v.rbac.enabled "reloader.serviceAccount.create" $v.serviceAccount.create "reloader.serviceMonitor.enabled" $v.serviceMonitor.enabled "reloader.podMonitor.enabled" $v.podMonitor.enabled "reloader.podDisruptionBudget.enabled" $v.podDisruptionBudget.enabled "reloader.netpol.enabled" $v.netpol.enabled "reloader.verticalPodAutoscaler.enabled" $v.verticalPodAutoscaler.enabled }}
{{- range $path := keys $switches | sortAlpha }}
{{- $value := get $switches $path }}
{{- if kindIs "string" $value }}
Note: {{ $path }} is the string {{ $value | quote }}, read as {{ if $value }}on{{ else }}off{{ end }} (as Reloader's chart reads it: any non-empty string is on); write true or false without quotes.
{{- end }}
{{- end }}
{{- end -}}
