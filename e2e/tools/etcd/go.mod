// Wrapper module: builds etcd from the module proxy.
module gpucluster.e2e/etcd

go 1.26.0

require go.etcd.io/etcd/server/v3 v3.6.5
