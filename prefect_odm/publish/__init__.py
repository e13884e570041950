"""Publishing a finished run's products: a STAC catalogue (:mod:`prefect_odm.publish.stac`)."""
