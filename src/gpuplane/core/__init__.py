"""Pure scheduling: quota, flavors, placement, devices, preemption and fair share."""
