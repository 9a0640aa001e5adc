// Wrapper module: builds the Python language host for the engine e2e test from sdk/v3 v3.78.0, the last release
// that still contains it (its own module, sdk/python/cmd/pulumi-language-python/v3, is not served).
module gpucluster.e2e/pulumi-language-python

go 1.26.6

require github.com/pulumi/pulumi/sdk/v3 v3.78.0
