"""Trust: the fleet's TUF image repository and the keys that sign it (DESIGN §3).

`custom` (the target custom field and path layout), `repository` (the pure rules),
`keys` (operator key files) and `signer` (the control plane's online keys). Nothing
here is imported or created at package import time.
"""
