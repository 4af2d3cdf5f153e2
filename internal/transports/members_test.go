package transports_test

import (
	"testing"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/transports"
)

// An agent with addresses is one client per member in an agentmux.Multi;
// failover is part of its key then.
func TestMembers(t *testing.T) {
	a := config.Agent{Name: "pair", Transport: config.TransportUDS, Address: "/run/a.sock", Addresses: []string{"/run/b.sock", "/run/c.sock"}}
	cfg := config.Config{Agents: []config.Agent{a}}
	cfg.SetDefaults()
	a = cfg.Agents[0]
	inst, err := transports.NewUDS(&a, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close()
	m, ok := inst.(*agentmux.Multi)
	if !ok || len(m.Members()) != 3 || m.Name() != "pair" {
		t.Fatalf("instance %T %+v", inst, inst)
	}
	if st := m.Snapshot(); st.Ready || st.Name != "pair" {
		t.Fatalf("snapshot of unreachable members %+v", st)
	}
	off := false
	b := a
	b.Failover = &off
	if transports.InstanceKey(a) == transports.InstanceKey(b) {
		t.Fatal("failover does not change the key of an agent with addresses")
	}
	single := config.Agent{Name: "one", Transport: config.TransportUDS, Address: "/run/a.sock"}
	cfg = config.Config{Agents: []config.Agent{single}}
	cfg.SetDefaults()
	inst1, err := transports.NewUDS(&cfg.Agents[0], zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer inst1.Close()
	if _, multi := inst1.(*agentmux.Multi); multi {
		t.Fatal("an agent without addresses got a Multi")
	}
}
