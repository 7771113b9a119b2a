{{/*
The objects carry the same names and labels as deploy/'s (tests/kube/test_manifests.py
compares them), so the chart adds no labels of its own; Helm marks what it installs with
app.kubernetes.io/managed-by and its meta.helm.sh annotations.
*/}}

{{/* An image reference: repository:tag, the chart's appVersion when tag is "". */}}
{{- define "lens-ebpf.image" -}}
{{- .image.repository }}:{{ .image.tag | default .appVersion }}
{{- end }}

{{/*
The PodDisruptionBudget's apiVersion: policy/v1 where the cluster serves it (Kubernetes
1.21 and newer; discovery lists policy/v1/PodDisruptionBudget, or the version says so when
rendering offline: helm template --kube-version), else policy/v1beta1 (1.20).
*/}}
{{- define "lens-ebpf.pdbApiVersion" -}}
{{- if or (.Capabilities.APIVersions.Has "policy/v1/PodDisruptionBudget") (semverCompare ">=1.21-0" .Capabilities.KubeVersion.Version) -}}
policy/v1
{{- else -}}
policy/v1beta1
{{- end }}
{{- end }}

{{/* "true" when the Prometheus Operator's objects are rendered (prometheusOperator.enabled). */}}
{{- define "lens-ebpf.prometheusOperator" -}}
{{- $on := toString .Values.prometheusOperator.enabled -}}
{{- if eq $on "auto" -}}
{{- .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" -}}
{{- else if has $on (list "true" "false") -}}
{{- $on -}}
{{- else -}}
{{- fail (printf "prometheusOperator.enabled is %q: true, false or auto" $on) -}}
{{- end }}
{{- end }}

{{/* Where the agents report: agent.reporterTarget, or this release's recorder. */}}
{{- define "lens-ebpf.reporterTarget" -}}
{{- if kindIs "invalid" .Values.agent.reporterTarget -}}
lens-ebpf-recorder.{{ .Release.Namespace }}:9472
{{- else -}}
{{- .Values.agent.reporterTarget -}}
{{- end }}
{{- end }}

{{/* The recorder's form, checked. */}}
{{- define "lens-ebpf.recorderMode" -}}
{{- if not (has .Values.recorder.mode (list "replicated" "single")) -}}
{{- fail (printf "recorder.mode is %q: replicated or single" .Values.recorder.mode) -}}
{{- end -}}
{{- .Values.recorder.mode -}}
{{- end }}
