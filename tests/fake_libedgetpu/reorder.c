/* A libedgetpu that enumerates USB TPUs as Coral's does and reorders after a firmware load.
 *
 * The devices are the directories of $FAKE_EDGETPU_USB (a fake sysfs
 * bus/usb/devices): a directory whose idVendor/idProduct read 1a6e/089a is a
 * TPU in its bootloader (DFU), 18d1/9302 one running its firmware. Like
 * libedgetpu (driver/beagle/beagle_usb_driver_provider.cc), the list holds the
 * DFU devices first, then the loaded ones, each in directory-name order.
 * Opening a DFU device "loads its firmware": its IDs become 18d1/9302, so it
 * moves behind every loaded device and the indices after it shift, as a real
 * one re-enumerates. ":N", "usb:N" are resolved afresh at every open, as
 * libedgetpu does. Each open appends "begin PATH" and "end PATH" to
 * $FAKE_EDGETPU_LOG, 50 ms apart, so that a test can see overlapping opens.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common.h"

struct edgetpu_device { int type; const char* path; };

#define MAX_DEVICES 16

static int read_id(const char* dir, const char* name, char* out) {
  char file[4096];
  snprintf(file, sizeof file, "%s/%s", dir, name);
  FILE* f = fopen(file, "r");
  if (!f) return 0;
  int ok = fscanf(f, "%15s", out) == 1;
  fclose(f);
  return ok;
}

static int cmp(const void* a, const void* b) { return strcmp(*(char* const*)a, *(char* const*)b); }

/* Fills paths with the TPUs in libedgetpu's order; returns how many. */
static int enumerate(char** paths) {
  const char* root = getenv("FAKE_EDGETPU_USB");
  char* names[MAX_DEVICES];
  int n = 0, count = 0;
  DIR* d = root ? opendir(root) : NULL;
  if (!d) return 0;
  struct dirent* e;
  while ((e = readdir(d)) && n < MAX_DEVICES)
    if (e->d_name[0] != '.') names[n++] = strdup(e->d_name);
  closedir(d);
  qsort(names, n, sizeof *names, cmp);
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < n; i++) {
      char dir[4096], vendor[16], product[16];
      snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
      if (!read_id(dir, "idVendor", vendor) || !read_id(dir, "idProduct", product)) continue;
      int dfu = !strcmp(vendor, "1a6e") && !strcmp(product, "089a");
      int loaded = !strcmp(vendor, "18d1") && !strcmp(product, "9302");
      if ((pass == 0 && dfu) || (pass == 1 && loaded)) paths[count++] = strdup(dir);
    }
  }
  for (int i = 0; i < n; i++) free(names[i]);
  return count;
}

static void write_id(const char* dir, const char* name, const char* value) {
  char file[4096];
  snprintf(file, sizeof file, "%s/%s", dir, name);
  FILE* f = fopen(file, "w");
  if (f) { fprintf(f, "%s\n", value); fclose(f); }
}

static void note(const char* what, const char* path) {
  const char* log = getenv("FAKE_EDGETPU_LOG");
  FILE* f = log ? fopen(log, "a") : NULL;
  if (f) { fprintf(f, "%s %s\n", what, path); fclose(f); }
}

static int prepare(void* context, TfLiteDelegate* delegate) { return 0; }

static TfLiteDelegate* open_path(const char* path) {
  note("begin", path);
  char vendor[16] = "", product[16] = "";
  read_id(path, "idVendor", vendor);
  read_id(path, "idProduct", product);
  if (!strcmp(vendor, "1a6e") && !strcmp(product, "089a")) {  /* the firmware load */
    write_id(path, "idVendor", "18d1");
    write_id(path, "idProduct", "9302");
  }
  usleep(50000);
  note("end", path);
  TfLiteDelegate* delegate = calloc(1, sizeof(TfLiteDelegate));
  delegate->Prepare = prepare;
  return delegate;
}

struct edgetpu_device* edgetpu_list_devices(size_t* num_devices) {
  char* paths[MAX_DEVICES];
  int n = enumerate(paths);
  struct edgetpu_device* out = calloc(n + 1, sizeof *out);
  for (int i = 0; i < n; i++) { out[i].type = 1; out[i].path = paths[i]; }
  *num_devices = n;
  return out;
}

void edgetpu_free_devices(struct edgetpu_device* devices) {
  for (int i = 0; devices && devices[i].path; i++) free((void*)devices[i].path);
  free(devices);
}

TfLiteDelegate* edgetpu_create_delegate(int type, const char* name, const void* options, size_t n) {
  return name ? open_path(name) : NULL;
}

void edgetpu_free_delegate(TfLiteDelegate* delegate) { free(delegate); }

TfLiteDelegate* tflite_plugin_create_delegate(char** keys, char** values, size_t n, ReportError report) {
  const char* device = "";
  for (size_t i = 0; i < n; i++)
    if (!strcmp(keys[i], "device")) device = values[i];
  char* paths[MAX_DEVICES];
  int count = enumerate(paths), index = 0;
  if (sscanf(device, ":%d", &index) != 1 && sscanf(device, "usb:%d", &index) != 1) index = 0;
  TfLiteDelegate* delegate = NULL;
  if (index < count) delegate = open_path(paths[index]);
  else report("Failed to open device\n");
  for (int i = 0; i < count; i++) free(paths[i]);
  return delegate;
}

void tflite_plugin_destroy_delegate(TfLiteDelegate* delegate) { free(delegate); }
