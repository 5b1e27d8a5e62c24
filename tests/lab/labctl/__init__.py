"""Lab control: build a cached Debian rootfs, boot hosts on it, write an inventory, clean up."""
