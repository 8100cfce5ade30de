{{/*
A manifest shared with the kustomize base (files/ links to manifests/), moved to the release
namespace.
*/}}
{{- define "jobset-inplace.file" -}}
{{- $ctx := index . 0 -}}
{{- $ctx.Files.Get (index . 1) | replace "jobset-inplace-system" $ctx.Release.Namespace -}}
{{- end -}}

{{/* "repository@digest" if a digest is set (what a release's chart sets), else
"repository:tag", the tag defaulting to the chart's appVersion. */}}
{{- define "jobset-inplace.image" -}}
{{- $image := index . 0 -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository ($image.tag | default (index . 1).Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{- define "jobset-inplace.selectorLabels" -}}
app.kubernetes.io/name: jobset-inplace-controller
{{- end -}}
