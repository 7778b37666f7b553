"""Running points: budget, plan, the loop, the simulator and MPI runners, sweep and the session."""
