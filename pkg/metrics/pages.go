// The device's zram statistics, the staging area's and the router's counters.

package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/device"
	"github.com/gzramd/gzramd/pkg/route"
)

// Info describes the running daemon; it becomes gzramd_info's labels and
// gzramd_disksize_bytes.
type Info struct {
	Version   string
	Export    string
	Algorithm string
	Backend   string // where staged batches go: "cpu" or "gpu"
	DiskSize  int64
}

// Device exports the device's zram-like statistics, its staging area's
// and the router's counters, read at scrape time. It implements
// prometheus.Collector.
type Device struct {
	info   Info
	device func() device.Stats
	router func() route.Stats

	infoDesc, diskSize                                                         *prometheus.Desc
	orig, compr, memUsed, memUsedMax, memLimit                                 *prometheus.Desc
	same, huge, stored, packed, packedObjects, lost, compacted, prefaultMisses *prometheus.Desc
	failedReads, failedWrites, invalidIO, notifyFree, tableLate                *prometheus.Desc
	staged, stagingBytes, stagingBusy, stagedTotal                             *prometheus.Desc
	stagingRefused, stagingWaits, stagingSealed, commitRetries, unusedSlots    *prometheus.Desc
	compressedPages, inlinePages                                               *prometheus.Desc
	tierPages, tierBytes, denseGroups, densePages, denseBytes, denseSkipped    *prometheus.Desc
	denseSeconds, denseGPUGroups, denseGPUSeconds, denseFrameReads             *prometheus.Desc
}

func gauge(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }

// NewDevice returns a collector over the snapshots dev and router return
// (typically (*device.Device).Stats and (*route.Router).Stats).
func NewDevice(info Info, dev func() device.Stats, router func() route.Stats) *Device {
	return &Device{
		info: info, device: dev, router: router,
		infoDesc: prometheus.NewDesc("gzramd_info", "Constant 1, labelled with the daemon's version, export, algorithm and backend.",
			[]string{"version", "export", "algorithm", "backend"}, nil),
		diskSize:      gauge("gzramd_disksize_bytes", "Size of the block device (zram disksize)."),
		orig:          gauge("gzramd_orig_data_bytes", "Uncompressed size of the pages held in the store, same-filled pages excluded (zram orig_data_size)."),
		compr:         gauge("gzramd_compr_data_bytes", "Compressed size of the stored pages (zram compr_data_size)."),
		memUsed:       gauge("gzramd_mem_used_bytes", "Memory the page store holds, fragmentation included (zram mem_used_total)."),
		memUsedMax:    gauge("gzramd_mem_used_max_bytes", "Highest gzramd_mem_used_bytes seen (zram mem_used_max)."),
		memLimit:      gauge("gzramd_mem_limit_bytes", "Most memory the page store may hold; 0 means no limit (zram mem_limit)."),
		same:          gauge("gzramd_same_pages", "Pages filled with one repeated 8-byte word: zero-filled ones cost no memory, others an 8-byte object (zram same_pages)."),
		huge:          gauge("gzramd_huge_pages", "Pages that did not compress below the huge threshold and are stored raw (zram huge_pages)."),
		stored:        gauge("gzramd_stored_pages", "Pages held in the store, compressed or raw."),
		packed:        gauge("gzramd_packed_pages", "Of the stored pages, those kept in objects of several pages compressed together (--object-pages)."),
		packedObjects: gauge("gzramd_packed_objects", "Objects of several pages compressed together (--object-pages)."),
		lost: gauge("gzramd_lost_pages",
			"Pages whose entries a takeover found naming nothing the store holds: they read as EIO until written again. Anything but 0 is a bug to report."),
		compacted: prometheus.NewDesc("gzramd_pages_compacted_total",
			"Memory pages given back by compaction (zram pages_compacted).", nil, nil),
		prefaultMisses: prometheus.NewDesc("gzramd_store_prefault_misses_total",
			"Times a write, or the dense tier, needed store memory before the prefaulter had faulted it in (--prefault): each waited for it, and failed with ENOSPC (the kernel keeps a swapped page) where the prefaulter made none ready within 1 s.", nil, nil),
		tableLate: prometheus.NewDesc("gzramd_table_late_faults_total",
			"Pages of the page table (each 2 MiB of device) a write faulted in itself, beyond what gzramd-table had faulted in ahead of the writes. Under swap it stays 0: such a fault could wait on the reclaim that waits on that write.", nil, nil),
		failedReads: prometheus.NewDesc("gzramd_failed_reads_total",
			"Reads that failed inside the device (zram failed_reads).", nil, nil),
		failedWrites: prometheus.NewDesc("gzramd_failed_writes_total",
			"Writes that failed inside the device, memory limit included (zram failed_writes).", nil, nil),
		invalidIO: prometheus.NewDesc("gzramd_invalid_io_total",
			"Requests outside the device or malformed (zram invalid_io).", nil, nil),
		notifyFree: prometheus.NewDesc("gzramd_notify_free_total",
			"Pages freed by trims and discards (zram notify_free).", nil, nil),
		staged: gauge("gzramd_staged_pages",
			"Pages acknowledged and held raw in the staging area until their batch is compressed (4 KiB each in the data and memory gauges)."),
		stagingBytes: gauge("gzramd_staging_bytes", "Size of the write-behind staging area (--staging); 0 without an accelerator."),
		stagingBusy:  gauge("gzramd_staging_busy_bytes", "Staging memory holding batches being filled, waiting or being compressed."),
		stagedTotal: prometheus.NewDesc("gzramd_staged_pages_total",
			"Page writes acknowledged from the staging area (write-behind).", nil, nil),
		stagingRefused: prometheus.NewDesc("gzramd_staging_full_total",
			"Writes that found the staging area full, waited --staging-wait in vain, and compressed their pages inline on the CPU.", nil, nil),
		stagingWaits: prometheus.NewDesc("gzramd_staging_waits_total",
			"Writes that found the staging area full and got room by waiting (--staging-wait).", nil, nil),
		stagingSealed: prometheus.NewDesc("gzramd_staging_batches_total",
			"Staged batches sent to compression, by why they were sealed: full, or deadline (--batch-deadline).", []string{"reason"}, nil),
		unusedSlots: prometheus.NewDesc("gzramd_staging_unused_slots_total",
			"Staging slots that held no write: pages received into staging that turned out same-filled, and receives aborted by a dropped request.", nil, nil),
		commitRetries: prometheus.NewDesc("gzramd_commit_retries_total",
			"Attempts to store a compressed staged batch that failed and were retried (the pages stayed staged).", nil, nil),
		compressedPages: prometheus.NewDesc("gzramd_compressed_pages_total",
			"Pages compressed, by where: gpu or cpu (the GPU's share of the written pages is gpu / sum).", []string{"backend"}, nil),
		inlinePages: prometheus.NewDesc("gzramd_inline_pages_total",
			"Of the pages compressed on the CPU, those a write compressed itself, in its request (no accelerator, staging full, or the accelerator backing off).", nil, nil),
		tierPages: prometheus.NewDesc("gzramd_tier_pages",
			"Stored pages by tier: fast (as written: lz4 or zstd pages, objects of --object-pages) or dense (groups idle for --dense-after, recompressed together with zstd).", []string{"tier"}, nil),
		tierBytes: prometheus.NewDesc("gzramd_tier_bytes",
			"Compressed bytes of the stored pages by tier (their sum is gzramd_compr_data_bytes).", []string{"tier"}, nil),
		denseGroups: prometheus.NewDesc("gzramd_dense_recompressed_groups_total",
			"Groups of 16 pages the dense tier recompressed.", nil, nil),
		densePages: prometheus.NewDesc("gzramd_dense_recompressed_pages_total",
			"Stored pages in the groups the dense tier recompressed.", nil, nil),
		denseBytes: prometheus.NewDesc("gzramd_dense_recompressed_bytes_total",
			"Compressed bytes of the groups the dense tier recompressed, before and after: the memory it saved is their difference.", []string{"when"}, nil),
		denseSkipped: prometheus.NewDesc("gzramd_dense_skipped_groups_total",
			"Idle groups the dense tier left as they were: raced (written while it worked; tried again once idle) or kept (not smaller recompressed).", []string{"reason"}, nil),
		denseSeconds: prometheus.NewDesc("gzramd_dense_busy_seconds_total",
			"Time the dense tier's recompressor worked on the CPU, at most --dense-cpu of the time it ran.", nil, nil),
		denseGPUGroups: prometheus.NewDesc("gzramd_dense_gpu_groups_total",
			"Idle groups the dense tier gave the GPU, by result: compressed there, or declined (a page of it would not fit a block; compressed on the CPU).", []string{"result"}, nil),
		denseGPUSeconds: prometheus.NewDesc("gzramd_dense_gpu_seconds_total",
			"Time the dense tier's recompressor waited for the GPU (not CPU time).", nil, nil),
		denseFrameReads: prometheus.NewDesc("gzramd_dense_frame_reads_total",
			"Frames of the dense tier that reads needed, by where they came from: the cache of the 8 frames last decoded (the kernel's next readahead window begins in the frame the last one ended in), or decoded.", []string{"from"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (m *Device) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		m.infoDesc, m.diskSize, m.orig, m.compr, m.memUsed, m.memUsedMax, m.memLimit,
		m.same, m.huge, m.stored, m.packed, m.packedObjects, m.lost, m.compacted, m.prefaultMisses, m.tableLate, m.failedReads, m.failedWrites, m.invalidIO, m.notifyFree,
		m.staged, m.stagingBytes, m.stagingBusy, m.stagedTotal, m.stagingRefused, m.stagingWaits, m.stagingSealed, m.commitRetries, m.unusedSlots,
		m.compressedPages, m.inlinePages,
		m.tierPages, m.tierBytes, m.denseGroups, m.densePages, m.denseBytes, m.denseSkipped, m.denseSeconds,
		m.denseGPUGroups, m.denseGPUSeconds, m.denseFrameReads,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *Device) Collect(ch chan<- prometheus.Metric) {
	g := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	c := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	ch <- prometheus.MustNewConstMetric(m.infoDesc, prometheus.GaugeValue, 1,
		m.info.Version, m.info.Export, m.info.Algorithm, m.info.Backend)
	g(m.diskSize, float64(m.info.DiskSize))
	st := m.device()
	g(m.orig, float64(st.OrigDataSize))
	g(m.compr, float64(st.ComprDataSize))
	g(m.memUsed, float64(st.MemUsedTotal))
	g(m.memUsedMax, float64(st.MemUsedMax))
	g(m.memLimit, float64(st.MemLimit))
	g(m.same, float64(st.SamePages))
	g(m.huge, float64(st.HugePages))
	g(m.stored, float64(st.StoredPages))
	g(m.packed, float64(st.PackedPages))
	g(m.packedObjects, float64(st.PackedObjects))
	g(m.lost, float64(st.LostPages))
	ch <- prometheus.MustNewConstMetric(m.tierPages, prometheus.GaugeValue, float64(st.StoredPages-st.DensePages), "fast")
	ch <- prometheus.MustNewConstMetric(m.tierPages, prometheus.GaugeValue, float64(st.DensePages), "dense")
	ch <- prometheus.MustNewConstMetric(m.tierBytes, prometheus.GaugeValue, float64(st.ComprDataSize-st.DenseBytes), "fast")
	ch <- prometheus.MustNewConstMetric(m.tierBytes, prometheus.GaugeValue, float64(st.DenseBytes), "dense")
	c(m.denseGroups, float64(st.Dense.Groups))
	c(m.densePages, float64(st.Dense.Pages))
	c(m.denseBytes, float64(st.Dense.BytesIn), "before")
	c(m.denseBytes, float64(st.Dense.BytesOut), "after")
	c(m.denseSkipped, float64(st.Dense.Raced), "raced")
	c(m.denseSkipped, float64(st.Dense.Kept), "kept")
	c(m.denseSeconds, st.Dense.Busy.Seconds())
	c(m.denseFrameReads, float64(st.DenseFramesCached), "cache")
	c(m.denseFrameReads, float64(st.DenseFramesDecoded), "decoded")
	c(m.denseGPUGroups, float64(st.Dense.OnGPU), "compressed")
	c(m.denseGPUGroups, float64(st.Dense.Declined), "declined")
	c(m.denseGPUSeconds, st.Dense.GPUTime.Seconds())
	c(m.compacted, float64(st.PagesCompacted))
	c(m.prefaultMisses, float64(st.PrefaultMisses))
	c(m.tableLate, float64(st.TableLate))
	c(m.failedReads, float64(st.FailedReads))
	c(m.failedWrites, float64(st.FailedWrites))
	c(m.invalidIO, float64(st.InvalidIO))
	c(m.notifyFree, float64(st.NotifyFree))
	batchBytes := float64(st.Staging.BatchPages * codec.PageSize)
	g(m.staged, float64(st.StagedPages))
	g(m.stagingBytes, float64(st.Staging.Batches)*batchBytes)
	g(m.stagingBusy, float64(st.Staging.Busy)*batchBytes)
	c(m.stagedTotal, float64(st.StagedWrites))
	c(m.stagingRefused, float64(st.Staging.Refused))
	c(m.stagingWaits, float64(st.Staging.Waited))
	c(m.stagingSealed, float64(st.Staging.SealedFull), "full")
	c(m.stagingSealed, float64(st.Staging.SealedDeadline), "deadline")
	c(m.commitRetries, float64(st.CommitRetries))
	c(m.unusedSlots, float64(st.UnusedSlots))
	rs := m.router()
	c(m.compressedPages, float64(rs.AcceleratorPages), "gpu")
	c(m.compressedPages, float64(rs.CPUPages), "cpu")
	c(m.inlinePages, float64(rs.InlinePages))
}
