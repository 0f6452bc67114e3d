{{/* Names, labels and the pieces every role's pod spec shares. */}}

{{- define "gregor.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gregor.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gregor.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every resource. */}}
{{- define "gregor.labels" -}}
helm.sh/chart: {{ include "gregor.chart" . }}
app.kubernetes.io/name: {{ include "gregor.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gregor
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one role: call with (dict "ctx" $ "component" "broker"). */}}
{{- define "gregor.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gregor.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gregor.componentLabels" -}}
{{ include "gregor.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gregor.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gregor.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gregor.image" -}}
{{- $repo := .Values.image.repository -}}
{{- if .Values.image.registry -}}{{- $repo = printf "%s/%s" .Values.image.registry $repo -}}{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repo .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "gregor.etcd.image" -}}
{{- with .Values.etcd.image -}}
{{- if .registry -}}{{ printf "%s/%s:%s" .registry .repository .tag }}{{- else -}}{{ printf "%s:%s" .repository .tag }}{{- end -}}
{{- end -}}
{{- end -}}

{{/* Service names. */}}
{{- define "gregor.etcd.headless" -}}{{ include "gregor.fullname" . }}-etcd-headless{{- end -}}
{{- define "gregor.broker.headless" -}}{{ include "gregor.fullname" . }}-broker-headless{{- end -}}

{{/* The etcd endpoints every etcd-using role gets: the in-chart members by their stable names, or externalEtcd. */}}
{{- define "gregor.etcd.endpoints" -}}
{{- if .Values.etcd.enabled -}}
{{- $full := include "gregor.fullname" . -}}
{{- $headless := include "gregor.etcd.headless" . -}}
{{- $eps := list -}}
{{- range $i := until (int .Values.etcd.replicas) -}}
{{- $eps = append $eps (printf "%s://%s-etcd-%d.%s.%s.svc.%s:%d" (include "gregor.etcd.scheme" $) $full $i $headless $.Release.Namespace $.Values.clusterDomain (int $.Values.etcd.ports.client)) -}}
{{- end -}}
{{- join "," $eps -}}
{{- else -}}
{{- if not .Values.externalEtcd.endpoints -}}
{{- fail "etcd.enabled is false: set externalEtcd.endpoints (http://host:port, ...)" -}}
{{- end -}}
{{- join "," .Values.externalEtcd.endpoints -}}
{{- end -}}
{{- end -}}

{{/* Every broker by its stable per-pod address: the bootstrap list of gateways and of the helm test. */}}
{{- define "gregor.broker.bootstrap" -}}
{{- $full := include "gregor.fullname" . -}}
{{- $headless := include "gregor.broker.headless" . -}}
{{- $eps := list -}}
{{- range $i := until (int .Values.brokers.replicas) -}}
{{- $eps = append $eps (printf "%s-broker-%d.%s.%s.svc.%s:%d" $full $i $headless $.Release.Namespace $.Values.clusterDomain (int $.Values.brokers.ports.grpc)) -}}
{{- end -}}
{{- join "," $eps -}}
{{- end -}}

{{/* Resources: explicit `resources`, else the named preset. Call with (dict "role" .Values.brokers). */}}
{{- define "gregor.resources" -}}
{{- if .role.resources -}}
{{ toYaml .role.resources }}
{{- else -}}
{{- $presets := dict
  "nano"   (dict "requests" (dict "cpu" "100m" "memory" "128Mi" "ephemeral-storage" "50Mi") "limits" (dict "cpu" "250m" "memory" "256Mi" "ephemeral-storage" "1Gi"))
  "micro"  (dict "requests" (dict "cpu" "250m" "memory" "256Mi" "ephemeral-storage" "50Mi") "limits" (dict "cpu" "500m" "memory" "512Mi" "ephemeral-storage" "1Gi"))
  "small"  (dict "requests" (dict "cpu" "500m" "memory" "512Mi" "ephemeral-storage" "50Mi") "limits" (dict "cpu" "1" "memory" "1Gi" "ephemeral-storage" "1Gi"))
  "medium" (dict "requests" (dict "cpu" "1" "memory" "1Gi" "ephemeral-storage" "50Mi") "limits" (dict "cpu" "2" "memory" "2Gi" "ephemeral-storage" "1Gi"))
  "large"  (dict "requests" (dict "cpu" "2" "memory" "4Gi" "ephemeral-storage" "50Mi") "limits" (dict "cpu" "4" "memory" "8Gi" "ephemeral-storage" "2Gi"))
  "xlarge" (dict "requests" (dict "cpu" "4" "memory" "8Gi" "ephemeral-storage" "50Mi") "limits" (dict "cpu" "8" "memory" "16Gi" "ephemeral-storage" "2Gi"))
-}}
{{- if ne .role.resourcesPreset "none" -}}
{{ toYaml (get $presets .role.resourcesPreset) }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Affinity: explicit `affinity`, else the anti-affinity preset on the hostname. (dict "ctx" $ "role" .Values.brokers "component" "broker") */}}
{{- define "gregor.affinity" -}}
{{- if .role.affinity -}}
{{ toYaml .role.affinity }}
{{- else if eq .role.podAntiAffinityPreset "hard" -}}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels: {{- include "gregor.selectorLabels" . | nindent 10 }}
{{- else if eq .role.podAntiAffinityPreset "soft" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels: {{- include "gregor.selectorLabels" . | nindent 12 }}
{{- end -}}
{{- end -}}

{{/* Scheduling block of a pod spec: affinity, spread, node selector, tolerations, priority. */}}
{{- define "gregor.scheduling" -}}
{{- $affinity := include "gregor.affinity" . -}}
{{- if $affinity }}
affinity: {{- $affinity | nindent 2 }}
{{- end }}
{{- if .role.topologySpreadConstraints }}
topologySpreadConstraints: {{- toYaml .role.topologySpreadConstraints | nindent 2 }}
{{- else if .ctx.Values.topologySpread.enabled }}
topologySpreadConstraints:
  - maxSkew: {{ .ctx.Values.topologySpread.maxSkew }}
    topologyKey: {{ .ctx.Values.topologySpread.topologyKey }}
    whenUnsatisfiable: {{ .ctx.Values.topologySpread.whenUnsatisfiable }}
    labelSelector:
      matchLabels: {{- include "gregor.selectorLabels" . | nindent 8 }}
{{- end }}
{{- with .role.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .role.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .role.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}

{{/* Pod-level settings shared by every Gregor pod. */}}
{{- define "gregor.podCommon" -}}
serviceAccountName: {{ include "gregor.serviceAccountName" . }}
automountServiceAccountToken: {{ .Values.serviceAccount.automountServiceAccountToken }}
enableServiceLinks: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
securityContext: {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}

{{/* Pod annotations: scrape hints for Prometheus without the Operator. (dict "ctx" $ "role" ... "port" N) */}}
{{- define "gregor.podAnnotations" -}}
{{- if .ctx.Values.metrics.enabled }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- if and .ctx.Values.tls.enabled .ctx.Values.metrics.https (ne (.component | default "") "etcd") }}
prometheus.io/scheme: https
{{- end }}
{{- end }}
{{- with .role.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* gRPC probes on grpc.health.v1 (service "" = the whole server). (dict "ctx" $ "port" N)
With tls.enabled the ports are TLS-only and the kubelet's gRPC probe speaks plain text: TCP probes then. */}}
{{- define "gregor.probeAction" -}}
{{- if .ctx.Values.tls.enabled -}}
tcpSocket:
  port: {{ .port }}
{{- else -}}
grpc:
  port: {{ .port }}
{{- end -}}
{{- end -}}

{{- define "gregor.grpcProbes" -}}
{{- $p := .ctx.Values.probes -}}
{{- if $p.startup.enabled }}
startupProbe:
  {{- include "gregor.probeAction" . | nindent 2 }}
  periodSeconds: {{ $p.startup.periodSeconds }}
  timeoutSeconds: {{ $p.startup.timeoutSeconds }}
  failureThreshold: {{ $p.startup.failureThreshold }}
{{- end }}
{{- if $p.liveness.enabled }}
livenessProbe:
  {{- include "gregor.probeAction" . | nindent 2 }}
  periodSeconds: {{ $p.liveness.periodSeconds }}
  timeoutSeconds: {{ $p.liveness.timeoutSeconds }}
  failureThreshold: {{ $p.liveness.failureThreshold }}
{{- end }}
{{- if $p.readiness.enabled }}
readinessProbe:
  {{- include "gregor.probeAction" . | nindent 2 }}
  periodSeconds: {{ $p.readiness.periodSeconds }}
  timeoutSeconds: {{ $p.readiness.timeoutSeconds }}
  failureThreshold: {{ $p.readiness.failureThreshold }}
{{- end }}
{{- end -}}

{{/* Env every Gregor container gets: its pod IP (bind and advertise address) and names. */}}
{{- define "gregor.podEnv" -}}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end -}}

{{/* The metrics port flag: the configured port, or -1 (off). */}}
{{- define "gregor.metricsPortArg" -}}
--metrics-port={{ ternary .Values.metrics.port -1 .Values.metrics.enabled }}
{{- end -}}

{{/* A PodDisruptionBudget. (dict "ctx" $ "role" ... "component" "broker") */}}
{{- define "gregor.pdb" -}}
{{- if .role.pdb.create }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "gregor.fullname" .ctx }}-{{ .component }}
  namespace: {{ .ctx.Release.Namespace }}
  labels: {{- include "gregor.componentLabels" . | nindent 4 }}
spec:
  maxUnavailable: {{ .role.pdb.maxUnavailable }}
  selector:
    matchLabels: {{- include "gregor.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end -}}

{{/* A metrics Service for one role (selected by the ServiceMonitor). (dict "ctx" $ "component" "broker" "port" N) */}}
{{- define "gregor.metricsService" -}}
{{- if .ctx.Values.metrics.enabled }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ include "gregor.fullname" .ctx }}-{{ .component }}-metrics
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "gregor.componentLabels" . | nindent 4 }}
    gregor.io/metrics: "true"
spec:
  type: ClusterIP
  ports:
    - name: metrics
      port: {{ .port }}
      targetPort: metrics
      protocol: TCP
  selector: {{- include "gregor.selectorLabels" . | nindent 4 }}
{{- end }}
{{- end -}}

{{/* Volumes every Gregor container needs with a read-only root filesystem. */}}
{{- define "gregor.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 256Mi
{{- end -}}

{{/* Pod template metadata. (dict "ctx" $ "role" ... "component" "broker" "port" METRICS_PORT ["checksum" S]) */}}
{{- define "gregor.podMeta" -}}
labels:
  {{- include "gregor.componentLabels" . | nindent 2 }}
  {{- with .role.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- $ann := include "gregor.podAnnotations" . }}
{{- if or (trim $ann) .checksum }}
annotations:
  {{- with .checksum }}
  checksum/config: {{ . }}
  {{- end }}
  {{- with trim $ann }}
  {{- . | nindent 2 }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* A role's properties file: the chart-owned keys, then <values>.config (sorted); a chart-owned key in
<values>.config is refused. (dict "ctx" $ "values" "brokers" "component" "broker" "owned" (dict KEY VALUE ...)) */}}
{{- define "gregor.properties" -}}
# Written by the Gregor chart from {{ .values }}.config; read by `gregor-{{ .component }} --config`.
{{- range $k, $v := .owned }}
{{ $k }}={{ $v }}
{{- end }}
{{- range $k, $v := (index .ctx.Values .values).config }}
{{- if hasKey $.owned $k }}{{ fail (printf "%s.config.%s is set by the chart; remove it" $.values $k) }}{{ end }}
{{ $k }}={{ include "gregor.propValue" $v }}
{{- end }}
{{- end -}}

{{/* A role's properties ConfigMap, then `---`. (dict "ctx" $ "component" "broker" "file" "server.properties" "props" S) */}}
{{- define "gregor.propertiesConfigMap" -}}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ include "gregor.fullname" .ctx }}-{{ .component }}
  namespace: {{ .ctx.Release.Namespace }}
  labels: {{- include "gregor.componentLabels" . | nindent 4 }}
data:
  {{ .file }}: |
    {{- .props | nindent 4 }}
---
{{- end -}}

{{/* The read-only mount of a role's properties ConfigMap (volume `config`) at /etc/gregor. */}}
{{- define "gregor.configMount" -}}
- name: config
  mountPath: /etc/gregor
  readOnly: true
{{- end -}}

{{- define "gregor.configVolume" -}}
- name: config
  configMap:
    name: {{ include "gregor.fullname" .ctx }}-{{ .component }}
{{- end -}}

{{/* A property value as text: whole numbers without Go's float formatting (1073741824, not 1.073741824e+09). */}}
{{- define "gregor.propValue" -}}
{{- if and (kindIs "float64" .) (eq (floor .) .) -}}
{{- int64 . -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}

{{/* Target labels the rules and dashboards select on (deploy/prometheus, deploy/grafana), the same ones
`gregor cluster up --prometheus` gives its targets: cluster, role (etcd, controller, broker, coordinator,
gateway) and id (the StatefulSet ordinal: broker.id, controller and coordinator ids, etcd member). */}}
{{- define "gregor.targetLabels" -}}
- targetLabel: cluster
  replacement: {{ .Values.clusterName | quote }}
- sourceLabels: [__meta_kubernetes_pod_label_app_kubernetes_io_component]
  targetLabel: role
- sourceLabels: [__meta_kubernetes_pod_label_apps_kubernetes_io_pod_index]
  targetLabel: id
{{- if and .Values.tls.enabled .Values.metrics.https }}
{{- /* etcd's metrics listener stays plain HTTP (--listen-metrics-urls): scraped so whatever `scheme` says. */}}
- sourceLabels: [__meta_kubernetes_pod_label_app_kubernetes_io_component]
  regex: etcd
  targetLabel: __scheme__
  replacement: http
{{- end }}
{{- end -}}


{{/* TLS (tls.enabled): the Secret holding tls.crt, tls.key and ca.crt of a component — tls.existingSecret
(one for every role), else the one cert-manager fills for it (<fullname>-<component>-tls).
(dict "ctx" $ "component" NAME) */}}
{{- define "gregor.tls.secretName" -}}
{{- if .ctx.Values.tls.existingSecret -}}
{{- .ctx.Values.tls.existingSecret -}}
{{- else if .ctx.Values.tls.certManager.enabled -}}
{{- include "gregor.fullname" .ctx }}-{{ .component }}-tls
{{- else -}}
{{- fail "tls.enabled: set tls.existingSecret (a Secret with tls.crt, tls.key, ca.crt) or tls.certManager.enabled" -}}
{{- end -}}
{{- end -}}

{{/* scheme and tlsConfig of a ServiceMonitor / PodMonitor endpoint: HTTPS with the TLS Secret's CA when
tls.enabled and metrics.https (nothing otherwise). (dict "ctx" $) */}}
{{- define "gregor.metrics.tls" -}}
{{- if and .ctx.Values.tls.enabled .ctx.Values.metrics.https }}
scheme: https
tlsConfig:
  ca:
    secret:
      name: {{ include "gregor.tls.secretName" (dict "ctx" .ctx "component" "broker") }}
      key: ca.crt
  {{- with .ctx.Values.metrics.tlsConfig.serverName }}
  serverName: {{ . }}
  {{- end }}
  insecureSkipVerify: {{ .ctx.Values.metrics.tlsConfig.insecureSkipVerify }}
{{- end }}
{{- end -}}

{{- define "gregor.etcd.scheme" -}}{{ if .Values.tls.enabled }}https{{ else }}http{{ end }}{{- end -}}

{{/* Adds the security.protocol / ssl.* keys (docs/security.md) to a role's chart-owned properties when
tls.enabled. Prints nothing. (dict "ctx" $ "owned" $owned "server" true|false) */}}
{{- define "gregor.tls.owned" -}}
{{- $t := .ctx.Values.tls -}}
{{- if $t.enabled -}}
{{- $_ := set .owned "security.protocol" "SSL" -}}
{{- $_ := set .owned "ssl.truststore.location" (printf "%s/ca.crt" $t.mountPath) -}}
{{- $_ := set .owned "ssl.keystore.location" (printf "%s/tls.crt" $t.mountPath) -}}
{{- $_ := set .owned "ssl.key.location" (printf "%s/tls.key" $t.mountPath) -}}
{{- if .server -}}
{{- $_ := set .owned "ssl.client.auth" $t.clientAuth -}}
{{- $_ := set .owned "metrics.security.protocol" (ternary "SSL" "PLAINTEXT" (.ctx.Values.metrics.https | default false)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The TLS Secret's mount and volume (nothing without tls.enabled). */}}
{{- define "gregor.tls.mount" -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: {{ .Values.tls.mountPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "gregor.tls.volume" -}}
{{- if .ctx.Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "gregor.tls.secretName" . }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{/* The address a role binds and advertises: its pod IP, or with tls.enabled its stable DNS name in the
headless Service (what the certificates name: hostname verification stays on). (dict "ctx" $ "headless" NAME) */}}
{{- define "gregor.advertisedHost" -}}
{{- if .ctx.Values.tls.enabled -}}
$(POD_NAME).{{ .headless }}.{{ .ctx.Release.Namespace }}.svc.{{ .ctx.Values.clusterDomain }}
{{- else -}}
$(POD_IP)
{{- end -}}
{{- end -}}
