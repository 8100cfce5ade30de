// Command jsi-test-dra-driver is a test DRA driver for the local cluster's real kubelet nodes
// (Dynamic Resource Allocation, the kubelet's DRA gRPC API through k8s.io/dynamic-resource-
// allocation's kubeletplugin helper). It publishes one ResourceSlice for its node (pool = the
// node's name) with -devices devices named dev-0, dev-1, ..., registers with the kubelet whose
// plugin registration directory is -registry, and prepares allocated claims with no CDI device
// (a test device has nothing to inject). It does not taint devices itself: the device-taint
// tests taint them with a DeviceTaintRule, as an administrator or a health monitor does, and
// kube-controller-manager's device-taint eviction controller evicts the pods using them.
//
// One process per kubelet: the registration directory and the plugin data directory are the
// node's own (several kubelets share this host).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

type driver struct {
	name   string
	cancel context.CancelFunc
}

// PrepareResourceClaims reports every device allocated from this driver, without CDI devices.
func (d *driver) PrepareResourceClaims(
	_ context.Context, claims []*resourceapi.ResourceClaim,
) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		var devices []kubeletplugin.Device
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Driver != d.name {
				continue
			}
			devices = append(devices, kubeletplugin.Device{
				Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
			})
			log.Printf("prepare %s/%s: %s/%s", claim.Namespace, claim.Name, r.Pool, r.Device)
		}
		out[claim.UID] = kubeletplugin.PrepareResult{Devices: devices}
	}
	return out, nil
}

// UnprepareResourceClaims has nothing to undo.
func (d *driver) UnprepareResourceClaims(
	_ context.Context, claims []kubeletplugin.NamespacedObject,
) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		out[claim.UID] = nil
		log.Printf("unprepare %s", claim.String())
	}
	return out, nil
}

// HandleError logs background errors (publishing slices) and stops on a fatal one.
func (d *driver) HandleError(_ context.Context, err error, msg string) {
	log.Printf("%s: %v", msg, err)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.cancel()
	}
}

// WatchHealthStatus: this driver reports no device health (the health service is off).
func (d *driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// logRegistration logs the kubelet's answer to the registration once it has come (the tests
// wait for the line: until then the kubelet cannot prepare claims).
func logRegistration(ctx context.Context, helper *kubeletplugin.Helper) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if status := helper.RegistrationStatus(); status != nil {
			log.Printf("kubelet registration: registered=%v error=%q", status.PluginRegistered, status.Error)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func main() {
	name := flag.String("driver", "", "driver name (a DNS subdomain)")
	node := flag.String("node", "", "the node whose kubelet this driver serves")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig for publishing ResourceSlices")
	registry := flag.String("registry", "", "the kubelet's plugin registration directory")
	data := flag.String("data", "", "this driver's own directory for its DRA socket")
	count := flag.Int("devices", 2, "devices on the node")
	flag.Parse()
	if *name == "" || *node == "" || *kubeconfig == "" || *registry == "" || *data == "" {
		log.Fatal("-driver, -node, -kubeconfig, -registry and -data are required")
	}
	log.SetPrefix(fmt.Sprintf("dra-driver %s: ", *node))

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		log.Fatalf("kubeconfig: %v", err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		log.Fatalf("client: %v", err)
	}
	if err := os.MkdirAll(*data, 0o755); err != nil {
		log.Fatalf("data directory: %v", err)
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	d := &driver{name: *name, cancel: cancel}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(*name),
		kubeletplugin.NodeName(*node),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(*registry),
		// <driver>-reg.sock under a kubelet --root-dir in the cache is over the 108 bytes of
		// a unix socket's path.
		kubeletplugin.RegistrarSocketFilename("jsi-dra-reg.sock"),
		kubeletplugin.PluginDataDirectoryPath(*data),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		log.Fatalf("start: %v", err)
	}
	defer helper.Stop()
	go logRegistration(ctx, helper)

	devices := make([]resourceapi.Device, *count)
	for i := range devices {
		devices[i] = resourceapi.Device{Name: fmt.Sprintf("dev-%d", i)}
	}
	pools := map[string]resourceslice.Pool{
		*node: {Slices: []resourceslice.Slice{{Devices: devices}}},
	}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: pools}); err != nil {
		log.Fatalf("publish: %v", err)
	}
	log.Printf("serving %d devices", *count)
	<-ctx.Done()
	log.Printf("stopping")
}
