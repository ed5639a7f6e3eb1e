// Package live plays a simulator scenario against a running deployment
// of geoquota, in real time, and reports what its clients saw in the
// simulator's form (a sim.Report), so that the two can be set side by
// side: the code behind sim live, and the end-to-end tests that drive a
// deployment as sim live does.
//
// A live run cannot keep a scenario's size: Fit restricts it to the
// deployment's regions and scales it down, its time so that a window
// lasts as long as asked and its traffic to what one machine can send.
// Play then runs the fitted scenario in one mode against the deployment:
//
//	sc, _, _, err := live.Fit(base, regions, 10*time.Second, 1500)
//	simulated, err := sim.Run(sc, "strict", seed, sim.Options{})
//	played, err := live.Play(ctx, live.Run{
//		Deployment: d.State(), Links: d, Scenario: sc, Mode: "strict",
//		Simulated: simulated, Seed: seed,
//	})
//
// Play adds the scenario's rule to every daemon's rules for the run (and
// puts the files back after), gives the links between regions the
// latencies the simulator drew, sends the scenario's requests
// (sim.Arrivals: the very requests the simulator made of the same seed)
// to the regions' replicas over HTTP at their times, plays its faults on
// the links (partition, split, heal), and counts what each request got,
// by counter and window. It starts on a window boundary, as the
// simulator's time 0 is.
//
// The deployment is named by its endpoints (harness.DeploymentState) and
// its links (Links): a harness.Deployment in the same process, or the
// supervisor of deploy/local up through its HTTP API (Supervisor).
package live
