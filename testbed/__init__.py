"""Local Kubernetes test harness: upstream binaries built from Go modules, an integration
control plane (etcd + kube-apiserver) and a full kwok-based cluster with JobSet and Kueue."""
