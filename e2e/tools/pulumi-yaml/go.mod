// Wrapper module: builds the Pulumi YAML language host, which runs the YAML examples under the engine e2e test.
module gpucluster.e2e/pulumi-yaml

go 1.26.0

require github.com/pulumi/pulumi-yaml v1.25.0
