{{/* Names: <release>-smolgate, or the release name when it already says smolgate. */}}
{{- define "smolgate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "smolgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: gateway, engine or redis (the NetworkPolicies select by these). */}}
{{- define "smolgate.selector" -}}
app.kubernetes.io/name: {{ default .root.Chart.Name .root.Values.nameOverride }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "smolgate.secretName" -}}
{{- default (printf "%s-secrets" (include "smolgate.fullname" .)) .Values.secrets.existingSecret -}}
{{- end -}}

{{/* The engine's headless Service: its DNS name resolves to one A record per ready replica. */}}
{{- define "smolgate.engineService" -}}
{{- printf "%s-engine" (include "smolgate.fullname" .) -}}
{{- end -}}

{{- define "smolgate.engineHost" -}}
{{- printf "%s.%s.svc.%s" (include "smolgate.engineService" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{- define "smolgate.redisUrl" -}}
{{- printf "redis://%s-redis.%s.svc.%s:%d/0" (include "smolgate.fullname" .) .Release.Namespace .Values.clusterDomain (int .Values.redis.port) -}}
{{- end -}}

{{/* The Redis URL as a container env value: the chart's Redis by name, an external one from the Secret. */}}
{{- define "smolgate.redisEnv" -}}
{{- if .root.Values.redis.enabled }}
- name: {{ .name }}
  value: {{ include "smolgate.redisUrl" .root | quote }}
{{- else }}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ include "smolgate.secretName" .root }}
      key: redis-url
{{- end }}
{{- end -}}

{{- define "smolgate.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ include "smolgate.secretName" .root }}
      key: {{ .key }}
{{- end -}}

{{/* The gateway's configuration file (the ConfigMap): the engine replicas as one discovered deployment, the chart's
     aliases, then gateway.config merged over it. */}}
{{- define "smolgate.gatewayConfig" -}}
{{- $model := .Values.model -}}
{{- $engine := dict "kind" "backend" "name" "engine" "discovery" "dns" "model" (default $model.name $model.servedName) "base_url" (printf "http://%s:%d/v1" (include "smolgate.engineHost" .) (int .Values.engine.port)) -}}
{{- $base := dict "embeddings" false "cache" (dict "backend" "redis") "model_aliases" $model.aliases "models" (dict $model.name (dict "deployments" (list $engine))) "router" (dict "discovery_interval_s" .Values.gateway.discoveryIntervalSeconds) -}}
{{- toYaml (mergeOverwrite $base (deepCopy .Values.gateway.config)) -}}
{{- end -}}

{{/* engine.settings as the SMOLGATE_<FIELD> variables backend/config.py reads (the engine and backend.fetch). */}}
{{- define "smolgate.engineSettingsEnv" -}}
{{- range $k, $v := .Values.engine.settings }}
- name: {{ printf "SMOLGATE_%s" (upper $k) }}
  value: {{ $v | toString | quote }}
{{- end }}
{{- end -}}
