"""The kernel: typed records, the roles' Protocols, the config, the ExGRPO maths, metric and actor names, atomic
files and fault points; pure, the lowest layer (docs/architecture.md, "Packages")."""
