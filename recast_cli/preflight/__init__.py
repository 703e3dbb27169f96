"""`recast preflight`: a setting's policy at its real architecture on random weights: the build on the meta
device and the record (``stage``), the phases run on the device (``phases``), the rewards and judges (``rewards``)."""
