{{/* Cross-field checks that values.schema.json cannot express with a clear message. */}}
{{- define "tunefleet.validate" -}}
{{- $x86 := index .Values.hardware "x86" | default dict }}
{{- if not $x86.enabled }}
{{- fail "hardware.x86.enabled must be true: the pipeline, ingest, extract, plan and build deployments run on the tunefleet-x86 work pool" }}
{{- end }}
{{- range $name, $hw := .Values.hardware }}
{{- if and $hw.enabled (not (has $name (list "x86" "x86-avx2" "arm" "gpu"))) (not (($hw.settings | default dict).target)) }}
{{- fail (printf "hardware.%s.settings.target is required: %s is not a built-in class (x86, x86-avx2, arm, gpu)" $name $name) }}
{{- end }}
{{- end }}
{{- end }}
