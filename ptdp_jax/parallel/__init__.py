"""The mesh and what spans devices and processes: the logical-axis rule table and sharding
helpers (sharding), the multi-process runtime (distributed, rendezvous, cross_process,
watchdog) and the agreed stop (stopping). May import config/ and exits."""
