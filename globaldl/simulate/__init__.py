"""Project training to thousands of devices on SimGrid, calibrated on the fleet's measurements."""
