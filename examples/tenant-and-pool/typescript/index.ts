import * as pulumi from "@pulumi/pulumi";
import * as gpucluster from "@pulumi/gpucluster";

const config = new pulumi.Config();
// The platform stack (this repository's program) exports what its tenants need as `tenancy`.
const platform = new pulumi.StackReference(config.require("platformStack"));

// The l40s pool of ../expansion.yaml: prepared over SSH, burned in, then labelled and tainted in Kubernetes.
const l40s = new gpucluster.GpuNodePool("dev-l40s", {
    specFile: "../expansion.yaml",
    pool: "l40s",
    sshPrivateKey: config.requireSecret("sshPrivateKey"),
    kubeconfig: config.getSecret("kubeconfig"), // kubectl's (drains, retirements): the Kubernetes provider's cluster
});

// A tenant on the platform's pools, checked against what the platform guarantees already.
const vision = new gpucluster.Tenant("dev-vision", {
    tenancy: platform.requireOutput("tenancy"),
    tenant: {
        name: "vision",
        groups: { edit: ["oidc:vision"] },
        gpu_quota: { h100: { nominal: 0, borrowing_limit: 8 } }, // borrows idle H100s
    },
});

export const burnIn = l40s.burnIn;
export const hosts = l40s.hosts;
export const namespace = vision.namespace;
export const queue = vision.localQueue;
