{{/* The namespace every namespaced object goes in. */}}
{{- define "mig.namespace" -}}
{{- .Values.namespace.name | default .Release.Namespace -}}
{{- end -}}

{{/* The image both daemons run. */}}
{{- define "mig.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* Labels of an object of component `app` (its selector is `app` alone, as kustomize's). */}}
{{- define "mig.labels" -}}
app: {{ . }}
app.kubernetes.io/part-of: mig-exporter
{{- end -}}

{{/* The pod and container security contexts every pod of the chart runs with. */}}
{{- define "mig.podSecurity" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}
{{- define "mig.containerSecurity" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The environment both daemons share: the layout and where the ConfigMaps are. */}}
{{- define "mig.layoutEnv" -}}
- name: TOPOLOGY_LAYOUT
  value: {{ .Values.layout }}
{{- if eq .Values.layout "single" }}
- name: TOPOLOGY_CM_NAME
  value: {{ .Values.topologyConfigMap }}
{{- end }}
- name: TOPOLOGY_CM_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
- name: PYTHONUNBUFFERED
  value: "1"
{{- end -}}

{{/* The exporter's generation and Kubernetes options (env), dcgm-exporter's names. */}}
{{- define "mig.exporterEnv" -}}
{{- if .Values.dcgmExporterVersion }}
- name: DCGM_EXPORTER_VERSION
  value: {{ .Values.dcgmExporterVersion | quote }}
{{- end }}
{{- if .Values.kubernetes.enablePodLabels }}
- name: KUBERNETES_ENABLE_POD_LABELS
  value: "true"
{{- end }}
{{- if .Values.kubernetes.podLabelAllowlistRegex }}
- name: KUBERNETES_POD_LABEL_ALLOWLIST_REGEX
  value: {{ .Values.kubernetes.podLabelAllowlistRegex | quote }}
{{- end }}
{{- if .Values.kubernetes.enablePodUID }}
- name: KUBERNETES_ENABLE_POD_UID
  value: "true"
{{- end }}
{{- if .Values.kubernetes.virtualGPUs }}
- name: KUBERNETES_VIRTUAL_GPUS
  value: "true"
{{- end }}
{{- if or .Values.tlsServerConfig.enabled .Values.basicAuth.users }}
- name: WEB_CONFIG_FILE
  value: /etc/mig-exporter/web/web-config.yml
{{- end }}
{{- end -}}

{{/* The web config's volume and mounts, where TLS or basic auth is on. */}}
{{- define "mig.webMounts" -}}
{{- if or .Values.tlsServerConfig.enabled .Values.basicAuth.users }}
- name: web-config
  mountPath: /etc/mig-exporter/web
  readOnly: true
{{- end }}
{{- if .Values.tlsServerConfig.enabled }}
- name: tls
  mountPath: /etc/mig-exporter/tls
  readOnly: true
{{- if .Values.tlsServerConfig.clientCASecretName }}
- name: client-ca
  mountPath: /etc/mig-exporter/client-ca
  readOnly: true
{{- end }}
{{- end }}
{{- range .Values.extraConfigMapVolumes }}
- name: {{ .name }}
  mountPath: /etc/dcgm-exporter/{{ .name }}
  readOnly: true
{{- end }}
{{- end -}}
{{- define "mig.webVolumes" -}}
{{- if or .Values.tlsServerConfig.enabled .Values.basicAuth.users }}
- name: web-config
  secret:
    secretName: {{ .Values.names.exporter }}-web-config
{{- end }}
{{- if .Values.tlsServerConfig.enabled }}
- name: tls
  secret:
    secretName: {{ .Values.tlsServerConfig.secretName }}
{{- if .Values.tlsServerConfig.clientCASecretName }}
- name: client-ca
  secret:
    secretName: {{ .Values.tlsServerConfig.clientCASecretName }}
{{- end }}
{{- end }}
{{- range .Values.extraConfigMapVolumes }}
- name: {{ .name }}
  configMap:
    name: {{ .name }}
{{- end }}
{{- end -}}

{{/* The scheme the exporters serve on. */}}
{{- define "mig.scheme" -}}
{{- if .Values.tlsServerConfig.enabled }}HTTPS{{ else }}HTTP{{ end -}}
{{- end -}}
