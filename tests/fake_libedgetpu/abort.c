/* A libedgetpu whose USB transfer fails: it logs a FATAL line as libedgetpu's
 * LOG(FATAL) does and aborts (SIGABRT), for the first $FAKE_EDGETPU_ABORTS
 * delegate loads (counted in the file $FAKE_EDGETPU_COUNT); later loads work
 * as the stub's. */
#include <stdio.h>
#include <stdlib.h>
#include "common.h"

static int prepare(void* context, TfLiteDelegate* delegate) { return 0; }

TfLiteDelegate* tflite_plugin_create_delegate(char** keys, char** values, size_t n, ReportError report) {
  const char* count_file = getenv("FAKE_EDGETPU_COUNT");
  int aborts = atoi(getenv("FAKE_EDGETPU_ABORTS") ? getenv("FAKE_EDGETPU_ABORTS") : "0"), done = 0;
  FILE* f = count_file ? fopen(count_file, "r") : NULL;
  if (f) { if (fscanf(f, "%d", &done) != 1) done = 0; fclose(f); }
  if (count_file && (f = fopen(count_file, "w"))) { fprintf(f, "%d\n", done + 1); fclose(f); }
  if (done < aborts) {
    fprintf(stderr, "F driver/usb/usb_driver.cc:1063] transfer on tag 2 failed. Abort. Deadline exceeded: USB transfer error 2 [LibUsbDataOutCallback]\n");
    abort();
  }
  TfLiteDelegate* delegate = calloc(1, sizeof(TfLiteDelegate));
  delegate->Prepare = prepare;
  return delegate;
}

void tflite_plugin_destroy_delegate(TfLiteDelegate* delegate) { free(delegate); }
