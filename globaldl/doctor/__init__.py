"""`globaldl doctor`: will a run across these devices work? One check per failure we have met."""
