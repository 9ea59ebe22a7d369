{{/*
Labels of every object: deploy/'s (app.kubernetes.io/name and component where deploy/ sets them, part-of on all)
and Helm's own. Called with (dict "ctx" $ "component" "adapter") or (dict "ctx" $ "name" "dcgm-exporter").
Selectors and pod templates use gpuscale.selectorLabels only, as in deploy/, so either install's pods match.
*/}}
{{- define "gpuscale.labels" -}}
{{- $ctx := .ctx -}}
{{- $labels := dict "app.kubernetes.io/part-of" "gpuscale" "app.kubernetes.io/managed-by" $ctx.Release.Service "app.kubernetes.io/instance" $ctx.Release.Name "app.kubernetes.io/version" $ctx.Chart.AppVersion "helm.sh/chart" (printf "%s-%s" $ctx.Chart.Name $ctx.Chart.Version) -}}
{{- if or .name .component -}}
{{- $_ := set $labels "app.kubernetes.io/name" (.name | default "gpuscale") -}}
{{- end -}}
{{- with .component -}}
{{- $_ := set $labels "app.kubernetes.io/component" . -}}
{{- end -}}
{{- toYaml (merge (.extra | default dict) $labels) -}}
{{- end -}}

{{- define "gpuscale.selectorLabels" -}}
app.kubernetes.io/name: gpuscale
app.kubernetes.io/component: {{ . }}
{{- end -}}

{{- define "gpuscale.image" -}}
{{ printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) | toJson }}
{{- end -}}

{{/*
One container argument, --name=value, as a YAML string: a value holding a line break, a quote or "- --flag" stays
inside this one argument (values.schema.json refuses such values first; this is the second wall).
Called with (list "refresh-interval" .Values.adapter.refreshInterval).
*/}}
{{- define "gpuscale.flag" -}}
{{ printf "--%s=%s" (index . 0) (index . 1) | toJson }}
{{- end -}}

{{/* The address the aggregator connects to and checks the certificate against. */}}
{{- define "gpuscale.adapterHost" -}}
gpuscale-adapter.{{ .Release.Namespace }}.svc
{{- end -}}

{{/* The Prometheus-compatible URL, or "" for the embedded scraper; fails on a missing or unknown source. */}}
{{- define "gpuscale.prometheusURL" -}}
{{- $s := .Values.metricsSource -}}
{{- if eq $s.type "prometheus" -}}
{{- required "metricsSource.prometheus.url: required with metricsSource.type=prometheus" $s.prometheus.url -}}
{{- else if eq $s.type "victoriametrics" -}}
{{- required "metricsSource.victoriametrics.url: required with metricsSource.type=victoriametrics (e.g. http://vmselect-vm.monitoring.svc:8481/select/0/prometheus)" $s.victoriametrics.url -}}
{{- else if ne $s.type "embedded" -}}
{{- fail (printf "metricsSource.type: %q is not one of prometheus, victoriametrics, embedded" $s.type) -}}
{{- end -}}
{{- end -}}

{{/* The policy files other than the catalogue, which go into the ConfigMap gpuscale-policies. */}}
{{- define "gpuscale.policyFiles" -}}
{{- omit .Values.policies "metrics.yaml" | toYaml -}}
{{- end -}}

{{- define "gpuscale.hasPolicyFiles" -}}
{{- if omit .Values.policies "metrics.yaml" }}true{{ end -}}
{{- end -}}

{{- define "gpuscale.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
{{- if .fsGroup }}
fsGroup: 65532
{{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "gpuscale.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
{{- if .runAsNonRoot }}
runAsNonRoot: true
{{- end }}
capabilities:
  drop: [ALL]
{{- if .seccomp }}
seccompProfile:
  type: RuntimeDefault
{{- end }}
{{- end -}}

{{- define "gpuscale.antiAffinity" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "gpuscale.selectorLabels" . | nindent 12 }}
{{- end -}}
