/* A libedgetpu whose delegate creation dereferences NULL, as Coral's 16.0
 * build does under a TFLite newer than 2.11 (google-coral/edgetpu#812). */
#include "common.h"

TfLiteDelegate* tflite_plugin_create_delegate(char** keys, char** values, size_t n, ReportError report) {
  volatile int* nowhere = NULL;
  *nowhere = 1;
  return NULL;
}

void tflite_plugin_destroy_delegate(TfLiteDelegate* delegate) {}
