// Command jsi-test-device-plugin is a test device plugin for the local cluster's real kubelet
// nodes (the kubelet device-plugin gRPC API, v1beta1): it advertises -devices devices of
// -resource to the kubelet whose device-plugins directory is -dir, and marks a device
// Unhealthy while its ID is a line of the -unhealthy file (the tests' lever), re-sending the
// list on every change, as a real GPU plugin does on an XID error. Allocate hands the device IDs
// to the container as JSI_TEST_DEVICES. It re-registers when the kubelet restarts (the kubelet
// removes every socket in the directory when it starts).
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
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
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

// serve starts the plugin's gRPC server on dir/name and registers it with the kubelet.
func serve(p *plugin, dir, name, resource string) (*grpc.Server, error) {
	sock := filepath.Join(dir, name)
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", sock, err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		srv.Stop()
		return nil, fmt.Errorf("kubelet socket: %w", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     name,
		ResourceName: resource,
		Options:      &pluginapi.DevicePluginOptions{},
	})
	if err != nil {
		srv.Stop()
		return nil, fmt.Errorf("register %s with the kubelet: %w", resource, err)
	}
	log.Printf("registered %s (%d devices) at %s", resource, len(p.ids), sock)
	return srv, nil
}

func main() {
	dir := flag.String("dir", pluginapi.DevicePluginPath, "the kubelet's device-plugins directory")
	resource := flag.String("resource", "jobset-inplace.dev/test-device", "extended resource name")
	count := flag.Int("devices", 2, "devices to advertise")
	prefix := flag.String("id-prefix", "dev", "device IDs are <prefix>-<n>")
	unhealthy := flag.String("unhealthy", "", "file listing the IDs of unhealthy devices, one per line")
	flag.Parse()
	if *count < 1 || *unhealthy == "" {
		log.Fatal("-devices must be >= 1 and -unhealthy set")
	}
	p := &plugin{unhealthy: *unhealthy}
	for i := 0; i < *count; i++ {
		p.ids = append(p.ids, fmt.Sprintf("%s-%d", *prefix, i))
	}
	name := "jsi-test-" + *prefix + ".sock"
	var srv *grpc.Server
	for {
		// (Re)start and register while our socket is missing: at start, and after the kubelet
		// restarted (it clears the directory) or before it is up.
		if _, err := os.Stat(filepath.Join(*dir, name)); srv == nil || err != nil {
			if srv != nil {
				srv.Stop()
				srv = nil
			}
			s, err := serve(p, *dir, name, *resource)
			if err != nil {
				log.Printf("%v; retrying", err)
			} else {
				srv = s
			}
		}
		time.Sleep(time.Second)
	}
}
