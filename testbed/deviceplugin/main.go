// Command jsi-test-device-plugin is a test device plugin for the local cluster's real kubelet
// nodes (the kubelet device-plugin gRPC API, v1beta1): it advertises -devices devices of
// -resource to the kubelet whose plugin registration directory is -registry, and marks a device
// Unhealthy while its ID is a line of the -unhealthy file (the tests' lever), re-sending the
// list on every change, as a real GPU plugin does on an XID error. Allocate hands the device IDs
// to the container as JSI_TEST_DEVICES.
//
// It registers through the kubelet's plugin watcher (<--root-dir>/plugins_registry), not the
// kubelet.sock of the device-plugins directory: that directory is compiled into the kubelet
// (/var/lib/kubelet/device-plugins, whatever --root-dir says), so several kubelets on one
// host, as the local cluster runs them, would share it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

const poll = 200 * time.Millisecond

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	ids       []string
	unhealthy string
}

func (p *plugin) devices() []*pluginapi.Device {
	bad := map[string]bool{}
	if data, err := os.ReadFile(p.unhealthy); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if id := strings.TrimSpace(line); id != "" {
				bad[id] = true
			}
		}
	}
	out := make([]*pluginapi.Device, 0, len(p.ids))
	for _, id := range p.ids {
		health := pluginapi.Healthy
		if bad[id] {
			health = pluginapi.Unhealthy
		}
		out = append(out, &pluginapi.Device{ID: id, Health: health})
	}
	return out
}

func describe(devs []*pluginapi.Device) string {
	parts := make([]string, 0, len(devs))
	for _, d := range devs {
		parts = append(parts, d.ID+"="+d.Health)
	}
	return strings.Join(parts, " ")
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	last := ""
	for {
		devs := p.devices()
		if now := describe(devs); now != last {
			if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
				return err
			}
			log.Printf("sent devices: %s", now)
			last = now
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-time.After(poll):
		}
	}
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		ids := append([]string(nil), c.DevicesIds...)
		sort.Strings(ids)
		log.Printf("allocated %s", strings.Join(ids, ","))
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"JSI_TEST_DEVICES": strings.Join(ids, ",")},
		})
	}
	return resp, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

// registrar answers the kubelet's plugin watcher (pluginregistration v1) on the plugin's socket:
// a DevicePlugin named after the resource, served on that same socket.
type registrar struct {
	registerapi.UnimplementedRegistrationServer
	resource, endpoint string
}

func (r *registrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.DevicePlugin,
		Name:              r.resource,
		Endpoint:          r.endpoint,
		SupportedVersions: []string{pluginapi.Version},
	}, nil
}

func (r *registrar) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if st.PluginRegistered {
		log.Printf("registered %s with the kubelet", r.resource)
	} else {
		log.Printf("the kubelet refused %s: %s", r.resource, st.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// serve starts the plugin's gRPC server on sock, where the kubelet's plugin watcher finds it.
func serve(p *plugin, sock, resource string) (*grpc.Server, error) {
	if err := os.MkdirAll(filepath.Dir(sock), 0o750); err != nil {
		return nil, err
	}
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", sock, err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	registerapi.RegisterRegistrationServer(srv, &registrar{resource: resource, endpoint: sock})
	go func() { _ = srv.Serve(lis) }()
	log.Printf("serving %s (%d devices) at %s", resource, len(p.ids), sock)
	return srv, nil
}

func main() {
	dir := flag.String("registry", "", "the kubelet's plugin registration directory (<--root-dir>/plugins_registry)")
	resource := flag.String("resource", "jobset-inplace.dev/test-device", "extended resource name")
	count := flag.Int("devices", 2, "devices to advertise")
	prefix := flag.String("id-prefix", "dev", "device IDs are <prefix>-<n>")
	unhealthy := flag.String("unhealthy", "", "file listing the IDs of unhealthy devices, one per line")
	flag.Parse()
	if *dir == "" || *count < 1 || *unhealthy == "" {
		log.Fatal("-registry must be set, -devices >= 1 and -unhealthy set")
	}
	p := &plugin{unhealthy: *unhealthy}
	for i := 0; i < *count; i++ {
		p.ids = append(p.ids, fmt.Sprintf("%s-%d", *prefix, i))
	}
	sock := filepath.Join(*dir, "jsi-test-"+*prefix+".sock")
	var srv *grpc.Server
	for {
		// (Re)start while our socket is missing: at start, or if someone removed it. A kubelet
		// that restarts finds the socket again by itself (its watcher scans the directory).
		if _, err := os.Stat(sock); srv == nil || err != nil {
			if srv != nil {
				srv.Stop()
				srv = nil
			}
			s, err := serve(p, sock, *resource)
			if err != nil {
				log.Printf("%v; retrying", err)
			} else {
				srv = s
			}
		}
		time.Sleep(time.Second)
	}
}
