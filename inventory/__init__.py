"""Who exists: tenants, workload groups and registered workloads. PKI issues only to registered
workloads; policy decides on their identities; the enforcer maps them to addresses."""
