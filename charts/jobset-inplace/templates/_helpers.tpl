{{/*
A manifest shared with the kustomize base (files/ links to manifests/), moved to the release
namespace.
*/}}
{{- define "jobset-inplace.file" -}}
{{- $ctx := index . 0 -}}
{{- $ctx.Files.Get (index . 1) | replace "jobset-inplace-system" $ctx.Release.Namespace -}}
{{- end -}}

{{/* "repository:tag", the tag defaulting to the chart's appVersion; "repository:tag@digest"
if a digest is set (a release's chart): pulled by the digest, the tag only read. */}}
{{- define "jobset-inplace.image" -}}
{{- $image := index . 0 -}}
{{- $ref := printf "%s:%s" $image.repository ($image.tag | default (index . 1).Chart.AppVersion) -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $ref $image.digest -}}
{{- else -}}
{{- $ref -}}
{{- end -}}
{{- end -}}

{{- define "jobset-inplace.selectorLabels" -}}
app.kubernetes.io/name: jobset-inplace-controller
{{- end -}}
