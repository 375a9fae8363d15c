"""The tensor-parallel plan of a model and the checks ``parallelize`` runs before it
changes anything."""
