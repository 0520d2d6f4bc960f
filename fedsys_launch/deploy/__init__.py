"""A real Flower deployment: the local topology and its command lines, the ``flwr`` CLI
client, the FAB staging, the kits of a federation across hosts, the sites' proxy, the
operator's view of the sites, and the SuperLink, SuperNode and SuperExec entry points."""
