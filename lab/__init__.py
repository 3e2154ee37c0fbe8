"""The lab fabric: a fabric file built on this machine from network namespaces, Open vSwitch and
nftables, so the enforcer's rule sets forward and drop real packets (`trustfabric lab up|down|status|
apply|probe`).

  lab.topology    the plan (pure): namespaces, interface names, addresses, OVS bridges and cable flows
  lab.build       carries a plan out and takes it away (also after a crash, by the lab's name prefix)
  lab.state       the state file under TRUSTFABRIC_HOME: what was made, and which bridge / namespace each
                  enforcer device id is (what a node agent attaches its backends to in agent mode)
  lab.standalone  standalone mode: compile the file with the shipped Rego and apply every device
  lab.probe       real TCP between two workloads, with the rule that decided and the enforcer's answer
  lab.operations  one function per command

Two modes: standalone (the lab compiles and applies) and agent (the lab builds the topology only; node
agents pull their devices' rule sets from the server and apply them through the same backends).
A layer beside api and pdp: it may import workflows and the domain packages, which never import it.
"""
