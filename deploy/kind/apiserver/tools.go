//go:build tools

// Package tools pins the kube-apiserver command in this module's dependency graph.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
