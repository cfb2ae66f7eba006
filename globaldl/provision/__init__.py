"""Provisioning devices with deploy/ansible: the offline wheelhouse per platform, inventories."""
